//go:build linux

package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// progressTimeout is --progress-timeout in these tests: a report is a
// run of leaderrun, which a loaded CI machine has taken a whole second
// to start and end.
const progressTimeout = 2 * time.Second

// progressJob writes a shell job that reports progress with `leaderrun
// check --progress` every 200 ms, `reports` times, then stops reporting and
// runs on (in `wait`, which a trapped signal interrupts at once). It
// records, in its own times, each report's start and end and when it got
// SIGTERM. With exit set, it exits 0 after its reports instead. It is a
// bash script for $EPOCHREALTIME, a clock read without a fork: `$(date)`
// forks and execs, which on a loaded host can add a hundred milliseconds
// to the time a stamp says.
func progressJob(t *testing.T, out string, reports int, exit bool) string {
	t.Helper()
	tail := "sleep 3600 &\nwait $!\n"
	if exit {
		tail = "exit 0\n"
	}
	script := fmt.Sprintf(`trap 'echo "term $EPOCHREALTIME" >> %[1]s; exit 143' TERM
for ((i = 0; i < %[3]d; i++)); do
	echo "asked $EPOCHREALTIME" >> %[1]s
	%[2]s check --progress || exit 9
	echo "reported $EPOCHREALTIME" >> %[1]s
	sleep 0.2
done
echo "quiet $EPOCHREALTIME" >> %[1]s
%[4]s`, out, testenv.Leaderrun(t), reports, tail)
	path := filepath.Join(t.TempDir(), "job.sh")
	testenv.WriteExecutable(t, path, []byte(script), 0o755)
	return path
}

// jobTimes reads the times a job recorded, by kind: $EPOCHREALTIME
// (seconds.microseconds) or nanoseconds.
func jobTimes(path string) map[string][]time.Time {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	times := map[string][]time.Time{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		kind, stamp, ok := strings.Cut(sc.Text(), " ")
		sec, usec, micro := strings.Cut(stamp, ".")
		n, err := strconv.ParseInt(sec+usec, 10, 64)
		if !ok || err != nil {
			continue
		}
		if micro {
			n *= 1000
		}
		times[kind] = append(times[kind], time.Unix(0, n))
	}
	return times
}

// testProgressTimeout: a job that reports progress five times and then stops
// reporting (but runs on) is sent the kill signal no earlier than
// --progress-timeout after its last report began, and within
// --progress-timeout + 250 ms of its last report's answer (the job's
// clock, and leaderrun's log of the signal); leaderrun exits 124 and records the term as stalled; a second
// leaderrun waiting on the lock starts its child at once. Repeated
// $E2E_PROGRESS_TRIALS times (default 3). A job that keeps reporting for
// five timeouts is never stopped, and leaderrun exits with its status.
func testProgressTimeout(t *testing.T, e *env) {
	trials := 3
	if n, err := strconv.Atoi(os.Getenv("E2E_PROGRESS_TRIALS")); err == nil && n > 0 {
		trials = n
	}
	var delays, takeovers []time.Duration
	for i := range trials {
		d, takeover := stallTrial(t, e, e.lock(fmt.Sprint(i)))
		delays, takeovers = append(delays, d), append(takeovers, takeover)
	}
	// Negative: before the answer's stamp plus the timeout. leaderrun
	// counts from the report's arrival, a little before the job has its
	// answer.
	t.Logf("SIGTERM sent after the job's last report was answered, beyond --progress-timeout %v: %v", progressTimeout, delays)
	t.Logf("takeover (the waiting host's child started after the stalled job's kill signal): %v", takeovers)

	t.Run("keeps reporting", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "times")
		reports := int(5 * progressTimeout / (200 * time.Millisecond))
		job := progressJob(t, out, reports, true)
		args := append(e.args(e.lock("steady"), "steady"), "--progress-timeout", progressTimeout.String(), "--", "/bin/bash", job)
		p := e.job(t, nil, args...)
		if code := p.wait(30 * time.Second); code != 0 {
			t.Fatalf("exit %d, want the job's 0:\n%s", code, p.stderr.String())
		}
		times := jobTimes(out)
		if len(times["term"]) > 0 {
			t.Errorf("the job was signalled although it kept reporting: %v", times)
		}
		if n := len(times["reported"]); n != reports {
			t.Errorf("%d reports answered, want %d", n, reports)
		}
	})
}

// stallTrial runs one stalled job on lock with a second leaderrun waiting
// behind it, and returns how long after the answer to the job's last
// report, beyond the timeout, the job got SIGTERM, and how long after that
// the waiting host's child started.
func stallTrial(t *testing.T, e *env, lock string) (delay, takeover time.Duration) {
	t.Helper()
	dir := t.TempDir()
	out, next := filepath.Join(dir, "times"), filepath.Join(dir, "next")
	job := progressJob(t, out, 5, false)
	first := e.job(t, nil, append(e.args(lock, "first"), "--progress-timeout", progressTimeout.String(), "--", "/bin/bash", job)...)
	waitFor(t, 10*time.Second, "the first job's first report", func() bool { return len(jobTimes(out)["reported"]) > 0 })
	second := e.job(t, nil, append(e.args(lock, "second"), "--", "/bin/bash", "-c", `echo "start $EPOCHREALTIME" >> `+next)...)
	if code := first.wait(30 * time.Second); code != 124 {
		t.Fatalf("the stalled job's leaderrun exited %d, want 124:\n%s", code, first.stderr.String())
	}
	times := jobTimes(out)
	asked, reported, term := times["asked"], times["reported"], times["term"]
	if len(reported) != 5 || len(term) != 1 || len(times["quiet"]) != 1 {
		t.Fatalf("the job recorded %v: want 5 reports, then quiet, then one SIGTERM", times)
	}
	lastAsked, lastReported := asked[len(asked)-1], reported[len(reported)-1]
	log := first.stderr.String()
	// When leaderrun sent the kill signal, by its own log (the same
	// clock): the job's own stamp adds how soon a busy machine ran its
	// trap.
	sent, ok := logLineTime(log, "no progress reported; stopping child")
	if !ok {
		t.Fatalf("leaderrun does not log that it stopped the child:\n%s", log)
	}
	delay = sent.Sub(lastReported) - progressTimeout
	if early := term[0].Sub(lastAsked); early < progressTimeout {
		t.Errorf("SIGTERM %v after the last report was sent, before the %v timeout", early, progressTimeout)
	}
	if early := sent.Sub(lastAsked); early < progressTimeout {
		t.Errorf("SIGTERM sent %v after the last report was sent, before the %v timeout", early, progressTimeout)
	}
	// Within 250 ms: a timer, not a check paced by the retry period (0.5
	// s or more here); a loaded CI machine has run the timer 113 ms late.
	if delay > 250*time.Millisecond {
		t.Errorf("SIGTERM sent %v after the last report's answer, want within %v + 250ms", sent.Sub(lastReported), progressTimeout)
	}
	t.Logf("SIGTERM sent %v after the last report's answer, received by the job %v after it",
		sent.Sub(lastReported).Round(time.Millisecond), term[0].Sub(lastReported).Round(time.Millisecond))
	for _, want := range []string{"no progress reported; stopping child", "since_last_report=", "leadership released"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log does not say %q:\n%s", want, log)
		}
	}
	if code := second.wait(30 * time.Second); code != 0 {
		t.Fatalf("the waiting leaderrun exited %d:\n%s", code, second.stderr.String())
	}
	started := jobTimes(next)["start"]
	if len(started) != 1 {
		t.Fatalf("the waiting host's child started %d times, want once", len(started))
	}
	takeover = started[0].Sub(term[0])
	hist, code := e.output(t, "history", lock, "--json", "--limit", "2")
	if code != 0 || !strings.Contains(hist, `"end":"stalled"`) || !strings.Contains(hist, "--progress-timeout "+progressTimeout.String()) ||
		!slices.ContainsFunc(strings.Split(hist, "\n"), func(l string) bool {
			return strings.Contains(l, `"identity":"first"`) && strings.Contains(l, `"end":"stalled"`)
		}) {
		t.Errorf("history (exit %d) does not record the first term as stalled:\n%s", code, hist)
	}
	return delay.Round(time.Millisecond), takeover.Round(time.Millisecond)
}
