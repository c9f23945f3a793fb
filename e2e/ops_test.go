//go:build linux

package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestNotifySocket: under systemd (Type=notify) leaderrun reports READY
// while standing by, STATUS as standby and as leader, WATCHDOG while
// renewals succeed, and STOPPING; the child does not see NOTIFY_SOCKET.
func TestNotifySocket(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	sock := filepath.Join(dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msgs := make(chan string, 256)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(buf[:n])
		}
	}()

	holder := start(t, childEnv(events, "forever"), cmdArgs(t, localArgs(dir, "unit", "--identity", "web-2"))...)
	waitEvents(t, events, 10*time.Second, "holder's child", func(evs []event) bool { return count(evs, "start") == 1 })

	env := append(childEnv(events, "forever"), "NOTIFY_SOCKET="+sock, "WATCHDOG_USEC=2000000")
	unit := start(t, env, cmdArgs(t, localArgs(dir, "unit", "--identity", "web-1"))...)
	var got []string
	expect := func(what string, match func(string) bool) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case m := <-msgs:
				got = append(got, m)
				if match(m) {
					return
				}
			case <-timeout:
				t.Fatalf("no %s from leaderrun; got %q", what, got)
			}
		}
	}
	expect("READY=1", func(m string) bool { return strings.Contains(m, "READY=1") })
	expect("standby STATUS naming the leader", func(m string) bool {
		return strings.Contains(m, "STATUS=standby; leader is web-2 (token 1)")
	})
	holder.signal(syscall.SIGTERM)
	holder.wait(10 * time.Second)
	expect("leading STATUS", func(m string) bool { return strings.Contains(m, "STATUS=leading with token 2") })
	expect("WATCHDOG=1", func(m string) bool { return strings.Contains(m, "WATCHDOG=1") })
	// The child catches SIGTERM once it has started: signalled before,
	// it would die of it (exit 143), which is not what this test is about.
	waitEvents(t, events, 10*time.Second, "unit's child", func(evs []event) bool { return count(evs, "start") == 2 })
	unit.signal(syscall.SIGTERM)
	expect("STOPPING=1", func(m string) bool { return strings.Contains(m, "STOPPING=1") })
	if code := unit.wait(10 * time.Second); code != 0 {
		t.Errorf("exit %d", code)
	}
	t.Logf("notifications: %q", got)
}

// TestCheckMinRemaining: with -v, a check that fails only because less
// than --min-remaining is left says so, instead of printing leader=true
// and exiting 1 without a reason.
func TestCheckMinRemaining(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	job := fmt.Sprintf(`%[1]s check -v; echo "plain=$?"; %[1]s check --min-remaining 1h -v; echo "min=$?"`, testenv.Leaderrun(t))
	p := start(t, nil, localArgs(dir, "chkmin", "--shell", "--", job)...)
	if code := p.wait(10 * time.Second); code != 0 {
		t.Fatalf("exit %d:\n%s", code, p.stderr.String())
	}
	// stdout and stderr are one stream here.
	out := p.stderr.String()
	for _, want := range []string{"leader=true token=1", "plain=0", "min=1", "less than --min-remaining 1h0m0s"} {
		if !strings.Contains(out, want) {
			t.Errorf("the output has no %q:\n%s", want, out)
		}
	}
}

// TestCheckSocketLeavesNothing: the check socket is a file in a
// directory of its own in $XDG_RUNTIME_DIR, which the child's
// LEADERRUN_SOCKET names. A leaderrun killed with SIGKILL leaves that
// directory behind (nothing in $TMPDIR); the next run removes it once it
// is stale (a minute old: its time is set back here), and leaves nothing
// either.
func TestCheckSocketLeavesNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	runtime, tmp := t.TempDir(), t.TempDir()
	env := []string{"XDG_RUNTIME_DIR=" + runtime, "TMPDIR=" + tmp}
	out := filepath.Join(dir, "socket")
	p := start(t, env, localArgs(dir, "sock", "--shell", "--", `echo "$LEADERRUN_SOCKET" > `+out+`; exec sleep 3600`)...)
	waitFor(t, 10*time.Second, "the child's LEADERRUN_SOCKET", func() bool {
		data, _ := os.ReadFile(out)
		return strings.HasSuffix(string(data), "\n")
	})
	data, _ := os.ReadFile(out)
	socket := strings.TrimSpace(string(data))
	if filepath.Dir(filepath.Dir(socket)) != runtime {
		t.Errorf("LEADERRUN_SOCKET=%q, want a socket in a directory of its own in $XDG_RUNTIME_DIR %s", socket, runtime)
	}
	p.signal(syscall.SIGKILL)
	p.wait(5 * time.Second)
	if entries, _ := os.ReadDir(tmp); len(entries) > 0 {
		t.Errorf("%s holds %v after leaderrun was killed", tmp, entries)
	}
	left := filepath.Dir(socket)
	if _, err := os.Stat(left); err != nil {
		t.Fatalf("the killed leaderrun's socket directory: %v; want it left behind (nothing ran its Close)", err)
	}
	old := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(left, old, old); err != nil {
		t.Fatal(err)
	}
	if code := start(t, env, localArgs(dir, "sock", "--", "true")...).wait(10 * time.Second); code != 0 {
		t.Fatalf("the next run: exit %d", code)
	}
	for _, d := range []string{runtime, tmp} {
		if entries, _ := os.ReadDir(d); len(entries) > 0 {
			t.Errorf("%s holds %v after the next run", d, entries)
		}
	}
}

// checkJob is a shell job that calls `leaderrun check` in a loop and
// appends "<unix-ns> <exit code>" to out for each call. It ignores SIGTERM
// so that it can observe what check says after the loss.
func checkJob(t *testing.T) (out, job string) {
	out = filepath.Join(t.TempDir(), "checks")
	job = fmt.Sprintf(`trap '' TERM; while :; do %s check; echo "$(date +%%s%%N) $?" >> %s; done`, testenv.Leaderrun(t), out)
	return out, job
}

// expectCheckFailsWithin requires every check asked later than bound
// after lost to fail, check never to succeed again once it failed, and
// leaderrun to exit 76. A check is asked once the one before it was
// recorded (the job's loop), so the record before a success bounds when
// that success was asked: on a busy machine the loop itself slows down,
// which the bound must not count.
func expectCheckFailsWithin(t *testing.T, p *proc, out string, lost time.Time, bound time.Duration) {
	t.Helper()
	waitFor(t, 5*time.Second+bound, "a failing check", func() bool { return len(checks(out, 1)) > 0 })
	first := checks(out, 1)[0]
	all := append(checks(out, 0), checks(out, 1)...)
	slices.SortFunc(all, func(a, b time.Time) int { return a.Compare(b) })
	var lastAsked time.Time // when the last successful check was asked, at the latest
	for _, ok := range checks(out, 0) {
		if i := slices.IndexFunc(all, func(r time.Time) bool { return r.Equal(ok) }); i > 0 {
			lastAsked = all[i-1]
		}
		if ok.After(first) {
			t.Errorf("check succeeded at %v, after it had failed at %v", ok, first)
		}
	}
	t.Logf("check failed %v after the loss; the last success was asked %v after it at the latest",
		first.Sub(lost).Round(time.Millisecond), lastAsked.Sub(lost).Round(time.Millisecond))
	if lastAsked.Sub(lost) > bound {
		t.Errorf("check still succeeded when asked %v after the loss, want none asked later than %v", lastAsked.Sub(lost), bound)
	}
	if code := p.wait(10 * time.Second); code != 76 {
		t.Errorf("exit %d, want 76", code)
	}
}

// checks returns the times at which check exited with code.
func checks(path string, code int) []time.Time {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var ts []time.Time
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 || fields[1] != strconv.Itoa(code) {
			continue
		}
		ns, _ := strconv.ParseInt(fields[0], 10, 64)
		ts = append(ts, time.Unix(0, ns))
	}
	return ts
}

// TestMetrics: /metrics shows leaderrun_is_leader 1 on the leader and 0 on a
// standby; /healthz answers.
func TestMetrics(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	addrA := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t, "127.0.0.1"))
	// Another loopback address: two free ports asked one after the other
	// can be the same one (the first is closed before the second is asked).
	addrB := fmt.Sprintf("127.0.0.2:%d", testenv.FreePort(t, "127.0.0.2"))
	a := start(t, childEnv(events, "forever"), cmdArgs(t, localArgs(dir, "met", "--identity", "a", "--metrics-addr", addrA))...)
	waitEvents(t, events, 10*time.Second, "a's child", func(evs []event) bool { return count(evs, "start") == 1 })
	b := start(t, childEnv(events, "forever"), cmdArgs(t, localArgs(dir, "met", "--identity", "b", "--metrics-addr", addrB))...)

	var leader, standby string
	waitFor(t, 10*time.Second, "both metrics endpoints", func() bool {
		leader, standby = scrape(addrA), scrape(addrB)
		return leader != "" && standby != ""
	})
	if !strings.Contains(leader, "\nleaderrun_is_leader{") || !hasSample(leader, "leaderrun_is_leader", "1") {
		t.Errorf("leader's metrics lack leaderrun_is_leader 1:\n%s", grep(leader, "leader"))
	}
	if !hasSample(leader, `leader_election_master_status{name="met"}`, "1") {
		t.Errorf("leader's metrics lack leader_election_master_status 1:\n%s", grep(leader, "leader"))
	}
	if !hasSample(standby, "leaderrun_is_leader", "0") {
		t.Errorf("standby's metrics lack leaderrun_is_leader 0:\n%s", grep(standby, "leader"))
	}
	resp, err := http.Get("http://" + addrA + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("/healthz: %v %v", resp, err)
	}
	if resp != nil {
		resp.Body.Close()
	}
	a.signal(syscall.SIGTERM)
	a.wait(10 * time.Second)
	waitFor(t, 10*time.Second, "b to lead", func() bool { return hasSample(scrape(addrB), "leaderrun_is_leader", "1") })
	b.signal(syscall.SIGTERM)
	b.wait(10 * time.Second)
}

func scrape(addr string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return "\n" + string(data)
}

// hasSample reports whether a line of the exposition starts with name (and
// its labels) and has value.
func hasSample(exposition, name, value string) bool {
	for _, line := range strings.Split(exposition, "\n") {
		if strings.HasPrefix(line, name) && strings.HasSuffix(line, " "+value) {
			return true
		}
	}
	return false
}

func grep(s, sub string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) && !strings.HasPrefix(line, "#") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
