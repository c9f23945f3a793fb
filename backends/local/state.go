package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// state is what <dir>/<lock>.state keeps besides the lock: the completion
// markers of once-keys and the history of terms. It is rewritten whole
// (write, fsync, rename) under an exclusive flock on the state directory,
// which every instance using the directory takes for such updates only,
// for microseconds.
type state struct {
	Markers map[string]backends.Marker `json:"markers,omitempty"`
	History []backends.Term            `json:"history,omitempty"`
}

// maxStateSize bounds what is read of the state file: a hundred terms and
// a few markers are far smaller; anything bigger is not ours.
const maxStateSize = 1 << 20

// readState reads the state file; a missing one is an empty state.
func (b *Backend) readState(d *dir) (state, error) {
	var st state
	data, err := d.readFile(b.stateName(), maxStateSize)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return st, nil
	case err != nil:
		return st, err
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("state file %s is corrupt: %v: %w", b.statePath(), err, backends.ErrCorruptState)
	}
	return st, nil
}

// updateState applies f to the state under the directory's flock and
// writes it back durably, dropping expired markers on the way.
func (b *Backend) updateState(d *dir, f func(*state) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	unlock, err := d.lockState()
	if err != nil {
		return err
	}
	defer unlock()
	st, err := b.readState(d)
	if err != nil {
		return err
	}
	if err := f(&st); err != nil {
		return err
	}
	now := time.Now()
	for k, m := range st.Markers {
		if !now.Before(m.Expires) {
			delete(st.Markers, k)
		}
	}
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return d.writeFile(b.stateName(), data)
}

// Completed implements backends.Backend.
func (b *Backend) Completed(_ context.Context, key string) (*backends.Marker, error) {
	d, err := b.state()
	if err != nil {
		return nil, err
	}
	st, err := b.readState(d)
	if err != nil {
		return nil, fmt.Errorf("local: read completion of %q: %w", key, err)
	}
	m, ok := st.Markers[key]
	if !ok || !time.Now().Before(m.Expires) {
		return nil, nil
	}
	return &m, nil
}

// Complete implements backends.Lease: the marker is written under the
// state flock only if the lock file this lease holds is still the one at
// the lock path (replacing the lock file is the one way to lose a flock).
func (l *lease) Complete(_ context.Context, m backends.Marker) error {
	err := l.b.updateState(l.d, func(st *state) error {
		if err := l.check(); err != nil {
			return err
		}
		if st.Markers == nil {
			st.Markers = map[string]backends.Marker{}
		}
		st.Markers[m.Key] = m
		return nil
	})
	if err != nil && !errors.Is(err, backends.ErrLeaseLost) {
		return fmt.Errorf("local: record completion of %q in %s: %w", m.Key, l.b.statePath(), err)
	}
	return err
}

// History implements backends.Backend.
func (b *Backend) History(_ context.Context, limit int) ([]backends.Term, error) {
	d, err := b.state()
	if err != nil {
		return nil, err
	}
	st, err := b.readState(d)
	if err != nil {
		return nil, b.unavailable("read history", err)
	}
	return backends.NewestFirst(st.History, limit), nil
}
