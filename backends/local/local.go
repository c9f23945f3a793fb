// Package local is a backend for one host and no server: flock(2) on
// <dir>/<lock>.lock, with the fencing token kept in <dir>/<lock>.token.
//
// The kernel drops a flock when the last descriptor of its open file goes
// away, so a holder that dies for any reason (SIGKILL included) frees the lock
// at once; the lease never expires otherwise (TTL 0). The token is a counter
// incremented and made durable (write, fsync, rename, fsync of the directory)
// while the lock is held, so it survives crashes and reboots.
//
// The state directory is treated as hostile until proven otherwise (see
// dir): a directory others can write to must not let them make leaderrun
// write, truncate or read other files, or reset the counter. The counter
// never wraps (it refuses to go past its top), and a missing counter file
// next to a lock file that records an earlier grant is refused rather than
// restarted at 1: the holder record in <lock>.lock is kept after release for
// that reason, and the history in <lock>.state says the same. The record
// names the identity, the token, the pid, and in a pool of N > 1 holders
// (--holders) N; the slots of a pool are locks of their own,
// <lock>.slot<i>.lock and the rest, in the same directory.
//
// The local backend is for development and for several instances on one
// machine. It coordinates nothing across hosts.
package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/leaderrun/leaderrun/backends"
)

// Config describes one lock.
type Config struct {
	// Dir is the state directory; it is created (0700) if missing.
	Dir string
	// Lock is the lock name; see backends.ValidateLockName.
	Lock string
}

// Backend is the local flock backend for one lock.
type Backend struct {
	path string
	lock string
	// root is the backend this one is a slot of (see Slot), nil for one
	// that New made: a slot backend uses root's state directory.
	root *Backend

	mu sync.Mutex
	d  *dir // opened and checked at first use
}

// New returns a backend for cfg.Lock in cfg.Dir. It touches nothing on disk
// until the first Campaign, Status or History.
func New(cfg Config) *Backend {
	return &Backend{path: cfg.Dir, lock: cfg.Lock}
}

// Slot implements backends.Backend: slot i is the lock
// backends.SlotLock(lock, i), with files of its own in the same state
// directory, which the slot backend shares with b.
func (b *Backend) Slot(i int) backends.Backend {
	r := b
	if b.root != nil {
		r = b.root
	}
	if i == 0 {
		return r
	}
	return &Backend{path: r.path, lock: backends.SlotLock(r.lock, i), root: r}
}

// state opens and checks the state directory once.
func (b *Backend) state() (*dir, error) {
	if b.root != nil {
		return b.root.state()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.d != nil {
		return b.d, nil
	}
	d, err := openDir(b.path)
	if err != nil {
		return nil, b.unavailable("open the state directory", err)
	}
	b.d = d
	return d, nil
}

// Name implements backends.Backend.
func (b *Backend) Name() string { return "local" }

// Close implements backends.Backend: it closes the state directory,
// unless b is a slot backend, which has nothing of its own to close.
func (b *Backend) Close() error {
	if b.root != nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.d == nil {
		return nil
	}
	err := b.d.close()
	b.d = nil
	return err
}

// The files of a lock, in the state directory.
func (b *Backend) lockName() string  { return b.lock + ".lock" }
func (b *Backend) tokenName() string { return b.lock + ".token" }
func (b *Backend) queueName() string { return b.lock + ".queue" }
func (b *Backend) stateName() string { return b.lock + ".state" }

func (b *Backend) lockPath() string  { return filepath.Join(b.path, b.lockName()) }
func (b *Backend) tokenPath() string { return filepath.Join(b.path, b.tokenName()) }
func (b *Backend) statePath() string { return filepath.Join(b.path, b.stateName()) }

// unavailable wraps err as the local store being unusable, unless it is
// already the more precise unsafe or corrupt state.
func (b *Backend) unavailable(op string, err error) error {
	if errors.Is(err, backends.ErrUnsafeState) || errors.Is(err, backends.ErrCorruptState) {
		return err
	}
	return fmt.Errorf("local: %s in %s: %w: %w", op, b.path, backends.ErrUnavailable, err)
}

// Campaign implements backends.Backend. Waiting candidates sleep on an
// inotify watch of the lock file (Linux) and retry when a holder closes it,
// so a handover costs no polling.
func (b *Backend) Campaign(ctx context.Context, opts backends.CampaignOptions) (backends.Lease, error) {
	d, err := b.state()
	if err != nil {
		return nil, err
	}
	var queue *os.File
	defer func() {
		if queue != nil {
			queue.Close()
		}
	}()
	for {
		l, err := b.campaignFile(ctx, d, opts, &queue)
		if !errors.Is(err, errReplaced) {
			return l, err
		}
	}
}

// errReplaced says the lock file was removed or replaced under us: start
// again on the new file.
var errReplaced = errors.New("local: lock file replaced")

// campaignFile waits for the lock on the file now at the lock path. It keeps
// that file open while it waits: closing it would wake every other waiter,
// which would close theirs and wake us, for ever.
func (b *Backend) campaignFile(ctx context.Context, d *dir, opts backends.CampaignOptions, queue **os.File) (backends.Lease, error) {
	f, err := d.open(b.lockName(), unix.O_RDWR|unix.O_CREAT)
	if err != nil {
		return nil, b.unavailable("open lock file", err)
	}
	// Watch before trying, so that a release between a try and the wait
	// still wakes us.
	w, err := newWatcher(b.lockPath())
	if err != nil {
		f.Close()
		return nil, b.unavailable("watch lock file", err)
	}
	defer w.close()
	for woken := false; ; woken = true {
		// A flock never expires: the attempt that wins is the lease's
		// proof of life, however long we waited before it.
		acquired := time.Now()
		err := tryLock(f, woken)
		if err == nil {
			if same, serr := d.sameFile(f, b.lockName()); serr != nil || !same {
				// Our lock is on an orphan file.
				f.Close()
				return nil, errReplaced
			}
			l, err := b.grant(d, f, opts, acquired)
			if err != nil {
				f.Close()
				return nil, err
			}
			return l, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, b.unavailable("lock "+b.lockPath(), err)
		}
		if opts.Try {
			f.Close()
			return nil, fmt.Errorf("local: %s: %w", b.lockPath(), backends.ErrLocked)
		}
		if *queue == nil {
			// A shared flock on the queue file counts this waiter for
			// Status; the kernel drops it if we die.
			q, err := d.open(b.queueName(), unix.O_RDONLY|unix.O_CREAT)
			if err == nil {
				if err = flock(q, syscall.LOCK_SH); err != nil {
					q.Close()
				}
			}
			if err != nil {
				f.Close()
				return nil, b.unavailable("join queue", err)
			}
			*queue = q
		}
		err = w.wait(ctx)
		if ctxErr := ctx.Err(); ctxErr != nil {
			f.Close()
			return nil, ctxErr
		}
		if err != nil {
			f.Close()
			return nil, b.unavailable("wait for lock", err)
		}
		if same, serr := d.sameFile(f, b.lockName()); serr != nil || !same {
			f.Close()
			return nil, errReplaced
		}
	}
}

// tryLock tries the lock once, or, woken by a close of the lock file, a
// few times within some 30 ms: the kernel reports the close of a file
// before it drops the flock that goes with it, so a waiter woken by a
// holder that died without unlocking (killed before it handed its lock
// file to its command's watchdog) may try a moment too early, and would
// then wait for an event that never comes.
func tryLock(f *os.File, woken bool) error {
	err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB)
	for delay := time.Millisecond; woken && errors.Is(err, syscall.EWOULDBLOCK) && delay <= 16*time.Millisecond; delay *= 2 {
		time.Sleep(delay)
		err = flock(f, syscall.LOCK_EX|syscall.LOCK_NB)
	}
	return err
}

// grant runs with the lock held: it bumps the token durably and writes the
// holder's record into the lock file for Status: its identity, token, pid
// and, in a pool of more than one holder, the pool's size. The record
// stays after release, as proof of the last token granted.
func (b *Backend) grant(d *dir, f *os.File, opts backends.CampaignOptions, acquired time.Time) (*lease, error) {
	token, err := b.nextToken(d, f)
	if err != nil {
		return nil, err
	}
	info := fmt.Sprintf("identity=%s\ntoken=%d\npid=%d\n", opts.Identity, token, os.Getpid())
	if n := opts.RecordedHolders(); n > 0 {
		info += fmt.Sprintf("holders=%d\n", n)
	}
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(info), 0)
	}
	if err != nil {
		return nil, b.unavailable("record holder", err)
	}
	l := &lease{
		b:        b,
		d:        d,
		f:        f,
		token:    token,
		acquired: acquired,
		Loss:     backends.NewLoss(),
	}
	if err := l.watchLoss(); err != nil {
		return nil, b.unavailable("watch lock file", err)
	}
	return l, nil
}

// maxTokenFile bounds what is read of a token file: a uint64 and a newline.
const maxTokenFile = 32

// nextToken reads, increments and durably stores the counter, with the
// lock held (f is the locked lock file). It never hands out a token that
// was granted before: a counter that cannot be parsed is an error, never a
// reset to zero; the counter refuses to wrap at the top of its range; and a
// missing counter with proof of an earlier grant (the lock file's holder
// record, the history) is an error, not a restart at 1.
func (b *Backend) nextToken(d *dir, f *os.File) (uint64, error) {
	var cur uint64
	data, err := d.readFile(b.tokenName(), maxTokenFile)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if last, where := b.lastGranted(d, f); last > 0 {
			return 0, fmt.Errorf("local: token file %s is missing, but %s shows token %d was granted; "+
				"starting again at 1 would hand out tokens fenced resources have seen: restore it (echo %d > %s): %w",
				b.tokenPath(), where, last, last, b.tokenPath(), backends.ErrCorruptState)
		}
	case errors.Is(err, backends.ErrUnsafeState):
		return 0, err
	case err != nil:
		return 0, fmt.Errorf("local: cannot read token file %s: %v: %w", b.tokenPath(), err, backends.ErrCorruptState)
	default:
		cur, err = strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
		if err != nil {
			// Never the contents: the file may not be what it claims.
			return 0, fmt.Errorf("local: token file %s is corrupt (%d bytes, not a decimal counter): %w",
				b.tokenPath(), len(data), backends.ErrCorruptState)
		}
	}
	if cur == math.MaxUint64 {
		return 0, fmt.Errorf("local: token file %s is at the top of its range (%d): a next token would wrap to 0: %w",
			b.tokenPath(), cur, backends.ErrCorruptState)
	}
	next := cur + 1
	if err := d.writeFile(b.tokenName(), []byte(strconv.FormatUint(next, 10)+"\n")); err != nil {
		return 0, b.unavailable("store token", err)
	}
	return next, nil
}

// lastGranted is the largest token an earlier grant left proof of, and
// where: the locked lock file's holder record, or the history.
func (b *Backend) lastGranted(d *dir, f *os.File) (uint64, string) {
	buf := make([]byte, 4096)
	n, _ := f.ReadAt(buf, 0)
	if t, err := strconv.ParseUint(tokenLine(buf[:n]), 10, 64); err == nil && t > 0 {
		return t, "the lock file " + b.lockPath()
	}
	if st, err := b.readState(d); err == nil && len(st.History) > 0 {
		return backends.NewestFirst(st.History, 1)[0].Token, "the history in " + b.statePath()
	}
	return 0, ""
}

// Status implements backends.Backend.
func (b *Backend) Status(ctx context.Context) (backends.Status, error) {
	st := backends.Status{Lock: b.lock, Backend: b.Name(), Key: b.lockPath(), Remaining: -1, Waiting: -1}
	d, err := b.state()
	if err != nil {
		return st, err
	}
	f, err := d.open(b.lockName(), unix.O_RDONLY)
	if errors.Is(err, os.ErrNotExist) {
		st.Waiting = 0
		return st, nil
	}
	if err != nil {
		return st, b.unavailable("open lock file", err)
	}
	defer f.Close()
	info, err := readInfo(f)
	if err != nil {
		return st, b.unavailable("read lock file", err)
	}
	held, err := isHeld(f, info)
	if err != nil {
		return st, b.unavailable("inspect locks", err)
	}
	st.Waiting = countWaiters(d, b.queueName())
	if !held {
		return st, nil
	}
	st.Held = true
	st.Identity = info["identity"]
	st.Token, _ = strconv.ParseUint(info["token"], 10, 64)
	st.Holders = backends.ParseHolders(info["holders"])
	if host, err := os.Hostname(); err == nil {
		st.Node = host
	}
	return st, nil
}

func readInfo(f *os.File) (map[string]string, error) {
	buf := make([]byte, 4096)
	n, err := f.ReadAt(buf, 0)
	if err != nil && n == 0 && !errors.Is(err, errEOF) {
		return nil, err
	}
	info := map[string]string{}
	for _, line := range bytes.Split(buf[:n], []byte("\n")) {
		k, v, ok := strings.Cut(string(line), "=")
		if ok {
			info[k] = v
		}
	}
	return info, nil
}

// lease is a held flock.
type lease struct {
	b        *Backend
	d        *dir
	f        *os.File
	token    uint64
	acquired time.Time

	*backends.Loss                    // Lost and Err
	stopWatch      context.CancelFunc // ends watchLoss's goroutine; nil if none
	watchWG        sync.WaitGroup
}

func (l *lease) Token() uint64               { return l.token }
func (l *lease) TTL() time.Duration          { return 0 }
func (l *lease) Acquired() time.Time         { return l.acquired }
func (l *lease) String() string              { return l.b.lockPath() }
func (l *lease) Renew(context.Context) error { return l.check() }

// LockFile is the locked lock file. The runner hands it to the command's
// watchdog, which holds it until the command's whole tree is gone: a
// flock belongs to the open file, and the kernel drops it only with the
// file's last descriptor, so no candidate can take the lock while any of
// the tree runs, even after leaderrun died (docs/safety.md, S10).
func (l *lease) LockFile() *os.File { return l.f }

// check verifies that the lock file we hold is still the one at the path.
// If it was removed or replaced, a newcomer can lock the new file while we
// hold the old one: that is loss of leadership, the one way to lose a flock.
func (l *lease) check() error {
	if err := l.Err(); err != nil {
		return err
	}
	same, err := l.d.sameFile(l.f, l.b.lockName())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("local: check %s: %w", l.b.lockPath(), err)
	}
	if !same {
		l.Set(fmt.Errorf("local: lock file %s was removed or replaced: %w", l.b.lockPath(), backends.ErrLeaseLost))
		return l.Err()
	}
	return nil
}

// Release implements backends.Lease: it appends term to the history,
// unlocks the file and closes it, which wakes waiters. Unlocked
// explicitly, not by the close: the watchdog may still hold a descriptor of
// the same open file (see LockFile), and a waiter that the close wakes
// must find the lock free.
func (l *lease) Release(_ context.Context, term *backends.Term) error {
	if !l.BeginRelease() {
		return nil
	}
	if l.stopWatch != nil {
		l.stopWatch()
	}
	l.watchWG.Wait()
	var herr error
	if term != nil {
		herr = l.b.updateState(l.d, func(st *state) error {
			st.History = append(st.History, *term)
			st.History = backends.NewestFirst(st.History, backends.HistoryLimit)
			return nil
		})
	}
	// The holder record stays: it is the proof of the last token should
	// the token file go missing.
	uerr := flock(l.f, syscall.LOCK_UN)
	if err := l.f.Close(); err != nil {
		return err
	}
	if uerr != nil {
		return fmt.Errorf("local: unlock %s: %w", l.b.lockPath(), uerr)
	}
	if herr != nil {
		return fmt.Errorf("local: record the term in %s: %w", l.b.statePath(), herr)
	}
	return nil
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}
