//go:build linux

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestEtcdBench measures, with E2E_BENCH=1, what the issue asks to report:
// start-to-child latency on a free lock next to `etcdctl lock NAME --
// COMMAND` on the same server (alternating runs, medians and their ratio),
// and the memory of a leading leaderrun built without the race detector.
// It asserts nothing about speed: numbers on a shared machine are for
// reading, not for failing a build.
func TestEtcdBench(t *testing.T) {
	if os.Getenv("E2E_BENCH") != "1" {
		t.Skip("set E2E_BENCH=1 to measure")
	}
	runs := 20
	if s := os.Getenv("E2E_BENCH_RUNS"); s != "" {
		runs, _ = strconv.Atoi(s)
	}
	bin := filepath.Join(t.TempDir(), "leaderrun-bench")
	_, file, _, _ := runtime.Caller(0)
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join(filepath.Dir(file), "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	eps := testenv.StartEtcd(t, 1).Endpoints()
	ep := strings.Join(eps, ",")
	etcdctl := testenv.EtcdctlBinary(t)
	stamp := filepath.Join(t.TempDir(), "stamp")
	// The same child for both: it writes the time it started.
	child := []string{"/bin/sh", "-c", `date +%s%N > "$STAMP"`}

	// measure runs argv and returns how long the child took to start and
	// how long the whole command took.
	measure := func(argv []string) (toChild, total time.Duration) {
		os.Remove(stamp)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), "STAMP="+stamp)
		began := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", argv, err, out)
		}
		total = time.Since(began)
		data, err := os.ReadFile(stamp)
		if err != nil {
			t.Fatalf("%v: the child did not run: %v", argv, err)
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return time.Unix(0, ns).Sub(began), total
	}
	var lrChild, lrTotal, ecChild, ecTotal []time.Duration
	for i := range runs {
		c, w := measure(append([]string{bin, "--etcd-endpoints", ep, "--lock", "bench-lr", "--quiet", "--"}, child...))
		lrChild, lrTotal = append(lrChild, c), append(lrTotal, w)
		c, w = measure(append([]string{etcdctl, "--endpoints", ep, "lock", "bench-ec", "--"}, child...))
		ecChild, ecTotal = append(ecChild, c), append(ecTotal, w)
		if i == 0 {
			t.Logf("first run: leaderrun %v to the child, etcdctl lock %v", lrChild[0], ecChild[0])
		}
	}
	lc, lt, ec, et := median(lrChild), median(lrTotal), median(ecChild), median(ecTotal)
	t.Logf("start-to-child, median of %d alternating runs: leaderrun %v, etcdctl lock %v: ratio %.2f", runs, lc, ec, float64(lc)/float64(ec))
	t.Logf("start-to-exit (child /bin/sh + date, lock released), median: leaderrun %v, etcdctl lock %v: ratio %.2f", lt, et, float64(lt)/float64(et))

	// Memory of a leader that renews every 200 ms, sampled for 3 s.
	p := exec.Command(bin, "--etcd-endpoints", ep, "--lock", "bench-rss", "--quiet",
		"--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "200ms", "--kill-grace", "500ms",
		"--", "/bin/sh", "-c", `date +%s%N > "$STAMP"; exec sleep 60`)
	p.Env = append(os.Environ(), "STAMP="+stamp)
	os.Remove(stamp)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		p.Process.Signal(os.Interrupt)
		p.Wait()
	}()
	waitFor(t, 10*time.Second, "the child to start", func() bool { _, err := os.Stat(stamp); return err == nil })
	var rss, hwm int
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		r, h := procMemory(t, p.Process.Pid)
		rss, hwm = max(rss, r), max(hwm, h)
	}
	t.Logf("leading leaderrun (non-race build, 3 s of renewals every 200 ms): VmRSS max %.1f MiB, VmHWM %.1f MiB",
		float64(rss)/1024, float64(hwm)/1024)
	if hwm > 20*1024 {
		t.Errorf("VmHWM %d KiB, want under 20 MiB", hwm)
	}
}

// procMemory reads VmRSS and VmHWM of pid, in KiB.
func procMemory(t *testing.T, pid int) (rss, hwm int) {
	t.Helper()
	hwm, rss, err := testenv.Memory(pid)
	if err != nil {
		t.Fatal(err)
	}
	return rss, hwm
}
