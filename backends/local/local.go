// Package local is the store for one host and no server: flock(2) on
// <dir>/<lock>.lock, with the fencing token kept in <dir>/<lock>.token. It
// is a backends.RecordLock whose clock is the kernel's: the flock is the
// lease, dropped when its holder dies, and never expires otherwise (TTL
// 0). The state directory is treated as hostile until proven otherwise
// (dir). docs/backends/local.md describes the files, argues the token and
// the lease, and gives every check of the state directory.
package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/leaderrun/leaderrun/backends"
)

// Store is the state directory, holding the files of every lock in it.
type Store struct {
	path string

	mu sync.Mutex
	d  *dir // opened and checked at first use
}

// Open returns the store of the state directory path. It touches nothing
// on disk until a lock is first used.
func Open(path string) *Store { return &Store{path: path} }

func (s *Store) Name() string                   { return "local" }
func (s *Store) Lock(name string) backends.Lock { return &lock{s: s, name: name} }

func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.d == nil {
		return nil
	}
	err := s.d.close()
	s.d = nil
	return err
}

// dir opens and checks the state directory, once.
func (s *Store) dir() (*dir, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.d != nil {
		return s.d, nil
	}
	d, err := openDir(s.path)
	if err != nil {
		return nil, unavailable(s.path, "open the state directory", err)
	}
	s.d = d
	return d, nil
}

// unavailable wraps err as the local store being unusable, unless it is
// already the more precise unsafe or corrupt state.
func unavailable(path, op string, err error) error {
	if errors.Is(err, backends.ErrUnsafeState) || errors.Is(err, backends.ErrCorruptState) {
		return err
	}
	return fmt.Errorf("local: %s in %s: %w: %w", op, path, backends.ErrUnavailable, err)
}

// lock is one lock's files in the state directory.
type lock struct {
	s    *Store
	name string
}

func (l *lock) lockName() string  { return l.name + ".lock" }
func (l *lock) tokenName() string { return l.name + ".token" }
func (l *lock) queueName() string { return l.name + ".queue" }

// Key is the lock file's path.
func (l *lock) Key() string { return filepath.Join(l.s.path, l.lockName()) }

// held is the Handle of a grant: the locked lock file.
type held struct{ f *os.File }

// LockFile is the locked lock file, which the command's watchdog holds
// until the command's whole tree is gone (S10).
func (h *held) LockFile() *os.File { return h.f }

// Get reads the holder record in the lock file, and whether any process
// holds its flock (Left is LeftUnknown while one does, 0 once not).
func (l *lock) Get(context.Context) (backends.Record, error) {
	d, err := l.s.dir()
	if err != nil {
		return backends.Record{}, err
	}
	rec := backends.Record{Left: 0, Waiting: countWaiters(d, l.queueName())}
	f, err := d.open(l.lockName(), unix.O_RDONLY)
	if errors.Is(err, os.ErrNotExist) {
		return rec, nil
	}
	if err != nil {
		return rec, unavailable(l.s.path, "open lock file", err)
	}
	defer f.Close()
	pid, err := readRecord(f, &rec)
	if err != nil {
		return rec, unavailable(l.s.path, "read lock file", err)
	}
	locked, err := isHeld(f, pid)
	if err != nil {
		return rec, unavailable(l.s.path, "inspect locks", err)
	}
	if locked {
		rec.Left = backends.LeftUnknown
	}
	return rec, nil
}

// readRecord reads the holder record of the lock file f into rec, and
// returns the holder's pid; the Version names the file and the grant.
func readRecord(f *os.File, rec *backends.Record) (int, error) {
	buf := make([]byte, 4096)
	n, err := f.ReadAt(buf, 0)
	if err != nil && n == 0 && !errors.Is(err, io.EOF) {
		return 0, err
	}
	info := map[string]string{}
	for _, line := range bytes.Split(buf[:n], []byte("\n")) {
		if k, v, ok := strings.Cut(string(line), "="); ok {
			info[k] = v
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, err
	}
	rec.Holder, rec.Owner = info["identity"], info["owner"]
	rec.Token, _ = strconv.ParseUint(info["token"], 10, 64)
	rec.Holders = backends.ParseHolders(info["holders"])
	rec.Version = fmt.Sprintf("%d:%d", st.Ino, rec.Token)
	if host, err := os.Hostname(); err == nil {
		rec.Node = host
	}
	pid, _ := strconv.Atoi(info["pid"])
	return pid, nil
}

// Take is conditional on the flock alone, whatever prev says, and only on
// the file that is at the lock's path.
func (l *lock) Take(_ context.Context, _ backends.Record, c backends.Claim) (backends.Record, error) {
	d, err := l.s.dir()
	if err != nil {
		return backends.Record{}, err
	}
	f, err := d.open(l.lockName(), unix.O_RDWR|unix.O_CREAT)
	if err != nil {
		return backends.Record{}, unavailable(l.s.path, "open lock file", err)
	}
	err = flockFd(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		if same, serr := d.sameFile(f, l.lockName()); serr != nil || !same {
			err = syscall.EWOULDBLOCK // our lock is on an orphan file
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return backends.Record{}, fmt.Errorf("local: %s: %w", l.Key(), backends.ErrConflict)
		}
		return backends.Record{}, unavailable(l.s.path, "lock "+l.Key(), err)
	}
	rec, err := l.grant(d, f, c)
	if err != nil {
		f.Close()
		return backends.Record{}, err
	}
	return rec, nil
}

// grant runs with the lock held: it bumps the token durably and writes the
// holder's record into the lock file.
func (l *lock) grant(d *dir, f *os.File, c backends.Claim) (backends.Record, error) {
	token, err := l.nextToken(d, f)
	if err != nil {
		return backends.Record{}, err
	}
	info := fmt.Sprintf("identity=%s\ntoken=%d\npid=%d\nowner=%s\n", c.Identity, token, os.Getpid(), c.Owner)
	if c.Holders > 1 {
		info += fmt.Sprintf("holders=%d\n", c.Holders)
	}
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(info), 0)
	}
	if err != nil {
		return backends.Record{}, unavailable(l.s.path, "record holder", err)
	}
	rec := backends.Record{Left: backends.LeftUnknown, Waiting: -1, Handle: &held{f: f}}
	if _, err := readRecord(f, &rec); err != nil {
		return backends.Record{}, unavailable(l.s.path, "read lock file", err)
	}
	return rec, nil
}

// maxTokenFile bounds what is read of a token file: a uint64 and a newline.
const maxTokenFile = 32

// nextToken reads, increments and durably stores the counter, with the
// lock held (f is the locked lock file). It never hands out a token that
// was granted before: it refuses a counter it cannot parse, one at the top
// of its range, and one missing beside proof of an earlier grant.
func (l *lock) nextToken(d *dir, f *os.File) (uint64, error) {
	path := filepath.Join(l.s.path, l.tokenName())
	var cur uint64
	data, err := d.readFile(l.tokenName(), maxTokenFile)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if last, where := l.lastGranted(d, f); last > 0 {
			return 0, fmt.Errorf("local: token file %s is missing, but %s shows token %d was granted; "+
				"starting again at 1 would hand out tokens fenced resources have seen: restore it (echo %d > %s): %w",
				path, where, last, last, path, backends.ErrCorruptState)
		}
	case errors.Is(err, backends.ErrUnsafeState):
		return 0, err
	case err != nil:
		return 0, fmt.Errorf("local: cannot read token file %s: %v: %w", path, err, backends.ErrCorruptState)
	default:
		cur, err = strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
		if err != nil {
			// Never the contents: the file may not be what it claims.
			return 0, fmt.Errorf("local: token file %s is corrupt (%d bytes, not a decimal counter): %w",
				path, len(data), backends.ErrCorruptState)
		}
	}
	if cur == math.MaxUint64 {
		return 0, fmt.Errorf("local: token file %s is at the top of its range (%d): a next token would wrap to 0: %w",
			path, cur, backends.ErrCorruptState)
	}
	next := cur + 1
	if err := d.writeFile(l.tokenName(), []byte(strconv.FormatUint(next, 10)+"\n")); err != nil {
		return 0, unavailable(l.s.path, "store token", err)
	}
	return next, nil
}

// lastGranted is the largest token an earlier grant left proof of, and
// where: the locked lock file's holder record, or the history.
func (l *lock) lastGranted(d *dir, f *os.File) (uint64, string) {
	buf := make([]byte, 4096)
	n, _ := f.ReadAt(buf, 0)
	if t, err := strconv.ParseUint(tokenLine(buf[:n]), 10, 64); err == nil && t > 0 {
		return t, "the lock file " + l.Key()
	}
	if t := l.lastTerm(d); t > 0 {
		return t, "the history in " + filepath.Join(l.s.path, l.docName(backends.DocHistory))
	}
	return 0, ""
}

// Keep: a flock never expires, so a renewal only checks that the file it
// locks is still the one at the lock's path. If it was removed or
// replaced, a newcomer can lock the new file while we hold the old one:
// the one way to lose a flock.
func (l *lock) Keep(_ context.Context, h backends.Record) (backends.Record, error) {
	d, err := l.s.dir()
	if err != nil {
		return h, err
	}
	return h, l.check(d, h)
}

func (l *lock) check(d *dir, h backends.Record) error {
	hd, ok := h.Handle.(*held)
	if !ok {
		return fmt.Errorf("local: %s is not held by this process: %w", l.Key(), backends.ErrLeaseLost)
	}
	same, err := d.sameFile(hd.f, l.lockName())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return unavailable(l.s.path, "check "+l.Key(), err)
	}
	if !same {
		return fmt.Errorf("local: lock file %s was removed or replaced: %w", l.Key(), backends.ErrLeaseLost)
	}
	return nil
}

// Free unlocks the file and closes it, which wakes waiters. Unlocked
// explicitly, not by the close: the watchdog may still hold a descriptor
// of the same open file, and a waiter that the close wakes must find the
// lock free. The holder record stays, as proof of the last token.
func (l *lock) Free(_ context.Context, h backends.Record) error {
	hd, ok := h.Handle.(*held)
	if !ok {
		return nil // not locked by this process: nothing to give up
	}
	f := hd.f
	uerr := flockFd(int(f.Fd()), unix.LOCK_UN)
	if err := f.Close(); err != nil {
		return err
	}
	if uerr != nil {
		return fmt.Errorf("local: unlock %s: %w", l.Key(), uerr)
	}
	return nil
}
