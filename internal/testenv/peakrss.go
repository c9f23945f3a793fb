package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var peakrss struct {
	once sync.Once
	path string
	err  error
}

// Measured is what RunMeasured saw of a command.
type Measured struct {
	Code   int           // its exit code
	Output string        // its stdout and stderr
	Took   time.Duration // from start to exit
	// PeakRSS is its peak resident set size in bytes, as wait4 reports
	// it, plus at most the few MiB of the small process that started it
	// (see internal/testenv/peakrss).
	PeakRSS int64
}

// RunMeasured runs argv through internal/testenv/peakrss and returns what
// it saw. It fails the test if the command runs longer than timeout (and
// kills it). Linux only: ru_maxrss is in KiB there.
func RunMeasured(t testing.TB, timeout time.Duration, argv ...string) Measured {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("RunMeasured reads ru_maxrss as Linux reports it")
	}
	helper := buildPeakRSS(t)
	out := filepath.Join(t.TempDir(), "peakrss")
	cmd := exec.Command(helper, argv...)
	cmd.Env = append(os.Environ(), "PEAKRSS_OUT="+out)
	var buf syncBuf
	cmd.Stdout, cmd.Stderr = &buf, &buf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	begin := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cmd.Wait()
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		t.Fatalf("%v still running after %v; output:\n%s", argv, timeout, buf.String())
	}
	m := Measured{Code: cmd.ProcessState.ExitCode(), Output: buf.String(), Took: time.Since(begin)}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("peak RSS of %v: %v; output:\n%s", argv, err, m.Output)
	}
	kib, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		t.Fatalf("peak RSS of %v: %q: %v", argv, data, err)
	}
	m.PeakRSS = kib << 10
	return m
}

// buildPeakRSS builds internal/testenv/peakrss once per test process.
func buildPeakRSS(t testing.TB) string {
	t.Helper()
	peakrss.once.Do(func() {
		dir, err := os.MkdirTemp("", "leaderrun-peakrss-")
		if err != nil {
			peakrss.err = err
			return
		}
		peakrss.path = filepath.Join(dir, "peakrss")
		_, file, _, _ := runtime.Caller(0)
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", peakrss.path, "./peakrss")
		cmd.Dir = filepath.Dir(file)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			peakrss.err = fmt.Errorf("build peakrss: %w\n%s", err, out)
		}
	})
	if peakrss.err != nil {
		t.Fatal(peakrss.err)
	}
	return peakrss.path
}

// syncBuf is a bytes.Buffer safe for the two writers of a command's output.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
