package main

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// tracesOn says whether spans are exported: -traces when given, else the
// standard OpenTelemetry environment (docs/metrics.md, Traces).
func tracesOn(flag string, getenv func(string) string) (bool, error) {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return false, nil
	}
	v := flag
	if v == "" {
		v = getenv("OTEL_TRACES_EXPORTER")
	}
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "otlp":
		return true, nil
	case "none":
		return false, nil
	case "":
		return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "", nil
	}
	if flag != "" {
		return false, fmt.Errorf("-traces: %q is neither otlp nor none", flag)
	}
	return false, fmt.Errorf("OTEL_TRACES_EXPORTER: %q is not supported (otlp or none)", v)
}

// newTracer returns the provider that exports spans over OTLP/HTTP, as
// the OTEL_EXPORTER_OTLP_* environment configures it, and its shutdown,
// which flushes the spans still batched.
func newTracer(ctx context.Context) (trace.TracerProvider, func(context.Context) error, error) {
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("traces: %w", err)
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (WithFromEnv) win over the default name.
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName("ssegate")),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, nil, fmt.Errorf("traces: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}
