// Package tracing gives okso's roles OpenTelemetry spans exported over
// OTLP/HTTP (--otlp-endpoint), continuing the W3C trace context a call
// carries from hop to hop (DESIGN.md §11). A nil *Tracer is tracing off:
// its methods do nothing and cost nothing, so that the call paths need no
// test of their own.
package tracing

import (
	"context"
	"fmt"
	"net/url"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// Tracer makes a role's spans. Make one with [New]; nil is off.
type Tracer struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
}

// New exports spans of service (okso-gateway, okso-device, …) to the
// OTLP/HTTP endpoint, an http:// or https:// URL (a collector's
// 4318 port, or Jaeger's): its path, /v1/traces if none. Spans are sent
// in batches; Shutdown sends what is left.
func New(ctx context.Context, endpoint, service, version string) (*Tracer, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--otlp-endpoint %q: want an http:// or https:// URL, such as http://127.0.0.1:4318", endpoint)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(u.String()))
	if err != nil {
		return nil, fmt.Errorf("--otlp-endpoint: %w", err)
	}
	res := resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(service), semconv.ServiceVersion(version))
	p := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracer{provider: p, tracer: p.Tracer("github.com/okso-io/okso")}, nil
}

// Shutdown exports the spans not yet sent, within ctx.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// ForceFlush exports the spans ended so far, within ctx.
func (t *Tracer) ForceFlush(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.provider.ForceFlush(ctx)
}

// Span is one hop of a call. A nil *Span does nothing.
type Span struct{ s trace.Span }

// Start starts a span named name, a child of the W3C traceparent given
// (a root when it is not one), of the kind given, and returns it with
// the traceparent the next hop continues: its own. Off, it returns nil
// and traceparent unchanged.
func (t *Tracer) Start(ctx context.Context, traceparent, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (*Span, string) {
	if t == nil {
		return nil, traceparent
	}
	ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
	ctx, s := t.tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return &Span{s}, carrier["traceparent"]
}

// End ends the span, failed with errorType when that is not empty (an
// okso error code, or tool_error for an upstream's own isError).
func (s *Span) End(errorType string, attrs ...attribute.KeyValue) {
	if s == nil {
		return
	}
	if errorType != "" {
		s.s.SetAttributes(attribute.String("error.type", errorType))
		s.s.SetStatus(codes.Error, errorType)
	}
	s.s.SetAttributes(attrs...)
	s.s.End()
}

// Name is a span's name as the MCP conventions write it: "{method}
// {target}", or the method alone.
func Name(method, target string) string {
	if target == "" {
		return method
	}
	return method + " " + target
}
