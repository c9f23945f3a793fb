package backends

import (
	"context"
	"time"
)

// Backoff is the pause schedule of a retry loop: Min after the first
// failure, doubling up to Max. Its zero value pauses 100 ms, doubling up to
// 2 s. Reset it after a success. It is not safe for concurrent use; each
// loop owns one.
type Backoff struct {
	// Min is the first pause. Zero: 100 ms.
	Min time.Duration
	// Max caps every pause. Zero: 2 s.
	Max time.Duration

	n int // failures since the last Reset
}

// Next returns the pause after one more failure.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = 100 * time.Millisecond
	}
	if hi <= 0 {
		hi = 2 * time.Second
	}
	d := lo << min(b.n, 20)
	b.n++
	return min(d, hi)
}

// Reset starts the schedule over, after a success.
func (b *Backoff) Reset() { b.n = 0 }

// Failures is the number of failures since the last Reset.
func (b *Backoff) Failures() int { return b.n }

// Sleep pauses for Next, or until ctx ends, whose error it then returns.
func (b *Backoff) Sleep(ctx context.Context) error {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
