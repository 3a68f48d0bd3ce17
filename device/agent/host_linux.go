package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// HostSampler measures the machine it runs on, from /proc and statfs (no
// cgo). CPU use is measured between two samples; the first sample, or one
// after a long pause, measures over a short window. It is safe for
// concurrent use.
type HostSampler struct {
	// Root is the file system whose use is reported ("/").
	Root string

	mu   sync.Mutex
	prev cpuTimes
	at   time.Time
}

type cpuTimes struct{ busy, total uint64 }

const cpuWindow = 200 * time.Millisecond

// Fork returns a sampler of the same host with its own CPU window.
func (h *HostSampler) Fork() Sampler { return &HostSampler{Root: h.Root} }

// Sample reads the host's figures.
func (h *HostSampler) Sample(ctx context.Context) (MetricsSample, error) {
	var m MetricsSample
	cpu, err := h.cpu(ctx)
	if err != nil {
		return m, err
	}
	m.CPUPct = round2(cpu)
	if m.MemTotalBytes, m.MemBytes, err = readMem(); err != nil {
		return m, err
	}
	root := h.Root
	if root == "" {
		root = "/"
	}
	if m.DiskPct, err = diskPct(root); err != nil {
		return m, err
	}
	if m.Load1m, m.Load5m, m.Load15m, err = readLoad(); err != nil {
		return m, err
	}
	return m, nil
}

func (h *HostSampler) cpu(ctx context.Context) (float64, error) {
	h.mu.Lock()
	prev, at := h.prev, h.at
	h.mu.Unlock()
	if at.IsZero() || time.Since(at) > time.Minute {
		var err error
		if prev, err = readCPU(); err != nil {
			return 0, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(cpuWindow):
		}
	}
	now, err := readCPU()
	if err != nil {
		return 0, err
	}
	h.mu.Lock()
	h.prev, h.at = now, time.Now()
	h.mu.Unlock()
	if now.total <= prev.total || now.busy < prev.busy {
		return 0, nil
	}
	pct := 100 * float64(now.busy-prev.busy) / float64(now.total-prev.total)
	return clamp(pct, 0, 100), nil
}

// readCPU reads the aggregate line of /proc/stat: user nice system idle
// iowait irq softirq steal (guest time is already in user).
func readCPU() (cpuTimes, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuTimes{}, fmt.Errorf("read cpu times: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return cpuTimes{}, errors.New("read cpu times: /proc/stat is empty")
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 9 || fields[0] != "cpu" {
		return cpuTimes{}, errors.New("read cpu times: unexpected /proc/stat")
	}
	var t cpuTimes
	for i, f := range fields[1:9] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return cpuTimes{}, fmt.Errorf("read cpu times: %w", err)
		}
		t.total += v
		if i != 3 && i != 4 { // idle, iowait
			t.busy += v
		}
	}
	return t, nil
}

// readMem returns total and used memory (total - available) in bytes.
func readMem() (total, used int64, err error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, fmt.Errorf("read memory: %w", err)
	}
	var avail int64 = -1
	for _, line := range bytes.Split(b, []byte("\n")) {
		f := strings.Fields(string(line))
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "MemTotal:":
			total = v * 1024
		case "MemAvailable:":
			avail = v * 1024
		}
	}
	if total <= 0 || avail < 0 {
		return 0, 0, errors.New("read memory: MemTotal or MemAvailable missing")
	}
	return total, max(total-avail, 0), nil
}

// diskPct is the used share of the file system at path, as df counts it
// (blocks reserved for root are neither used nor available).
func diskPct(path string) (float64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	used := float64(st.Blocks - st.Bfree)
	denom := used + float64(st.Bavail)
	if denom <= 0 {
		return 0, nil
	}
	return round2(clamp(100*used/denom, 0, 100)), nil
}

func readLoad() (l1, l5, l15 float64, err error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, 0, 0, fmt.Errorf("read load: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return 0, 0, 0, errors.New("read load: unexpected /proc/loadavg")
	}
	var v [3]float64
	for i := range v {
		if v[i], err = strconv.ParseFloat(f[i], 64); err != nil {
			return 0, 0, 0, fmt.Errorf("read load: %w", err)
		}
	}
	return v[0], v[1], v[2], nil
}
