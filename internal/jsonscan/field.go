package jsonscan

import (
	"reflect"
	"strings"
)

// FieldByName returns the field of struct t that encoding/json fills
// from the key name when name is exactly that field's name (not another
// case of it), looking into embedded structs as encoding/json does.
func FieldByName(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		key, _, _ := strings.Cut(tag, ",")
		if key == "" && f.Anonymous {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				if sf, ok := FieldByName(ft, name); ok {
					return sf, true
				}
				continue
			}
		}
		if key == "" {
			key = f.Name
		}
		if key == name && f.IsExported() {
			return f, true
		}
	}
	return reflect.StructField{}, false
}
