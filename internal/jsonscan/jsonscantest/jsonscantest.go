// Package jsonscantest is the one oracle of okso's one-pass JSON readers
// (package jsonscan and the fast decoders built on it), for their tests
// and fuzz targets: what such a reader accepts, encoding/json must decode
// strictly, and to the same value. It imports nothing of okso, so the
// readers it judges share no code with it.
//
//	f.Fuzz(func(t *testing.T, b []byte) {
//		var c Cmd
//		if fastCmd(b, &c) {
//			jsonscantest.Agrees(t, b, c)
//		}
//	})
package jsonscantest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/okso-io/okso/internal/jsonscan"
)

// Strict decodes the JSON document b into v, a pointer, with
// encoding/json, and refuses what okso's strict decoders refuse although
// encoding/json alone takes it: anything but exactly one value with white
// space around it, a key written twice in one object (at any depth), and
// a key of an object decoded into a struct that is not exactly one of its
// fields' names (encoding/json matches names whatever their case, and
// ignores unknown ones).
func Strict(b []byte, v any) error {
	if !json.Valid(b) {
		return errors.New("not one valid JSON document")
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber() // a number beyond float64 is valid JSON all the same
	if err := walk(d, reflect.TypeOf(v)); err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// Agrees fails t unless b decodes strictly ([Strict]) into a T deeply
// equal to got: what a one-pass reader returned for b.
func Agrees[T any](t testing.TB, b []byte, got T) {
	t.Helper()
	var want T
	if err := Strict(b, &want); err != nil {
		t.Fatalf("%q: read as %#v in one pass, refused by encoding/json (strict): %v", b, got, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\none pass %#v\nencoding/json (strict) %#v", b, got, want)
	}
}

var rawMessage = reflect.TypeFor[json.RawMessage]()

// walk reads the next value of d, which encoding/json decodes into a value
// of type t (nil: any), checking its objects' keys.
func walk(d *json.Decoder, t reflect.Type) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawMessage || t != nil && t.Kind() == reflect.Interface {
		t = nil
	}
	tok, err := d.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for d.More() {
			tok, err := d.Token()
			if err != nil {
				return err
			}
			k := tok.(string)
			if seen[k] {
				return fmt.Errorf("key %q written twice", k)
			}
			seen[k] = true
			var elem reflect.Type
			switch {
			case t == nil:
			case t.Kind() == reflect.Struct:
				f, ok := jsonscan.FieldByName(t, k)
				if !ok {
					return fmt.Errorf("key %q names no field of %v exactly", k, t)
				}
				elem = f.Type
			case t.Kind() == reflect.Map:
				elem = t.Elem()
			}
			if err := walk(d, elem); err != nil {
				return err
			}
		}
		_, err = d.Token()
		return err
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for d.More() {
			if err := walk(d, elem); err != nil {
				return err
			}
		}
		_, err = d.Token()
		return err
	}
	return nil
}
