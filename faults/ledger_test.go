package faults

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// write is one write the ledger received.
type write struct {
	At       time.Time
	Token    uint64
	Writer   string // identity/pid
	Accepted bool
}

// life is one child's presence: from its hello to its connection closing.
type life struct {
	Writer   string
	Identity string
	Pid      int
	Token    uint64
	Start    time.Time
	End      time.Time // zero while the child lives
}

// ledger is the fenced resource: it accepts a write only if its token is at
// least the highest accepted so far.
type ledger struct {
	http     *http.Server
	httpLn   net.Listener
	presence net.Listener
	wg       sync.WaitGroup

	mu     sync.Mutex
	max    uint64
	writes []write
	lives  []*life
	conns  map[net.Conn]bool
}

func newLedger(t testing.TB) *ledger {
	t.Helper()
	l := &ledger{conns: map[net.Conn]bool{}}
	var err error
	if l.httpLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if l.presence, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/write", l.handleWrite)
	l.http = &http.Server{Handler: mux}
	l.wg.Add(2)
	go func() {
		defer l.wg.Done()
		_ = l.http.Serve(l.httpLn)
	}()
	go l.acceptPresence()
	return l
}

// env is what a child needs to find the ledger.
func (l *ledger) env() []string {
	return []string{"FAULTS_CHILD=1", "FAULTS_LEDGER=" + l.httpLn.Addr().String(), "FAULTS_PRESENCE=" + l.presence.Addr().String()}
}

func (l *ledger) handleWrite(w http.ResponseWriter, r *http.Request) {
	token, err := strconv.ParseUint(r.URL.Query().Get("token"), 10, 64)
	if err != nil {
		http.Error(w, "bad token", http.StatusBadRequest)
		return
	}
	l.mu.Lock()
	ok := token >= l.max
	if ok {
		l.max = token
	}
	l.writes = append(l.writes, write{At: time.Now(), Token: token, Writer: r.URL.Query().Get("writer"), Accepted: ok})
	l.mu.Unlock()
	if !ok {
		http.Error(w, "stale token", http.StatusConflict)
	}
}

func (l *ledger) acceptPresence() {
	defer l.wg.Done()
	for {
		c, err := l.presence.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		l.conns[c] = true
		l.mu.Unlock()
		l.wg.Add(1)
		go l.hold(c)
	}
}

// hold records a child's hello and, when its connection closes, its end.
func (l *ledger) hold(c net.Conn) {
	defer l.wg.Done()
	defer func() {
		c.Close()
		l.mu.Lock()
		delete(l.conns, c)
		l.mu.Unlock()
	}()
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return
	}
	f := strings.Fields(line)
	if len(f) != 4 {
		return
	}
	token, _ := strconv.ParseUint(f[2], 10, 64)
	pid, _ := strconv.Atoi(f[3])
	lf := &life{Writer: f[0], Identity: f[1], Token: token, Pid: pid, Start: time.Now()}
	l.mu.Lock()
	l.lives = append(l.lives, lf)
	l.mu.Unlock()
	var b [1]byte
	_, _ = r.Read(b[:]) // returns when the child's end closes: exit, crash or SIGKILL
	l.mu.Lock()
	lf.End = time.Now()
	l.mu.Unlock()
}

// snapshot copies what the ledger knows.
func (l *ledger) snapshot() ([]write, []life) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ws := append([]write(nil), l.writes...)
	ls := make([]life, len(l.lives))
	for i, lf := range l.lives {
		ls[i] = *lf
	}
	return ws, ls
}

// accepted counts accepted writes by writer.
func (l *ledger) accepted(writer string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, w := range l.writes {
		if w.Writer == writer && w.Accepted {
			n++
		}
	}
	return n
}

// close stops the ledger and ends every presence still open (children
// still alive at the end are a violation recorded before this is called).
func (l *ledger) close() {
	l.http.Close()
	l.presence.Close()
	l.mu.Lock()
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

// childMain is the child: hello on the presence connection, then a write
// every 50 ms with $FENCE_TOKEN until SIGTERM or death.
func childMain() int {
	poolEnv()
	token := os.Getenv("FENCE_TOKEN")
	id := os.Getenv("LEADERRUN_IDENTITY")
	writer := fmt.Sprintf("%s/%d", id, os.Getpid())
	sigs := make(chan os.Signal, 1)
	if os.Getenv("FAULTS_HELPER") != "" {
		// The escaped helper: deaf to SIGTERM and SIGINT, only SIGKILL
		// ends it.
		signal.Ignore(syscall.SIGTERM, syscall.SIGINT)
	} else {
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	}
	if os.Getenv("FAULTS_ESCAPE") != "" && os.Getenv("FAULTS_HELPER") == "" {
		// The job starts `setsid some-daemon &` that writes with its token
		// too: the ledger tracks its life like the child's.
		self, err := os.Executable()
		if err == nil {
			helper := exec.Command(self)
			helper.Env = append(os.Environ(), "FAULTS_HELPER=1")
			helper.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			err = helper.Start()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "child: escaped helper:", err)
			return 1
		}
	}
	c, err := net.Dial("tcp", os.Getenv("FAULTS_PRESENCE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: presence:", err)
		return 1
	}
	defer c.Close()
	fmt.Fprintf(c, "%s %s %s %d\n", writer, id, token, os.Getpid())
	client := &http.Client{Timeout: time.Second}
	url := fmt.Sprintf("http://%s/write?token=%s&writer=%s", os.Getenv("FAULTS_LEDGER"), token, writer)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if resp, err := client.Post(url, "text/plain", nil); err == nil {
			resp.Body.Close()
		}
		select {
		case <-sigs:
			return 0
		case <-t.C:
		}
	}
}

func httpPost(url string) (int, error) {
	resp, err := http.Post(url, "text/plain", nil)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
