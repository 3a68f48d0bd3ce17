//go:build !linux

package agent

import (
	"context"
	"errors"
)

// HostSampler measures the machine it runs on; it is implemented for Linux
// only, elsewhere every sample fails.
type HostSampler struct {
	Root string
}

// Sample fails: host metrics need Linux's /proc.
func (h *HostSampler) Sample(context.Context) (MetricsSample, error) {
	return MetricsSample{}, errors.New("host metrics are implemented for Linux only")
}
