package signals

import (
	"syscall"
	"testing"
)

func TestParse(t *testing.T) {
	cases := []struct {
		in      string
		want    syscall.Signal
		wantErr bool
	}{
		{in: "SIGTERM", want: syscall.SIGTERM},
		{in: "TERM", want: syscall.SIGTERM},
		{in: "int", want: syscall.SIGINT},
		{in: "sigusr1", want: syscall.SIGUSR1},
		{in: "9", want: syscall.SIGKILL},
		{in: "SIGFOO", wantErr: true},
		{in: "0", wantErr: true},
		{in: "65", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tc := range cases {
		got, err := Parse(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("Parse(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestExitCode(t *testing.T) {
	cases := []struct {
		st   Status
		want int
		str  string
	}{
		{st: Status{Code: 0}, want: 0, str: "exit status 0"},
		{st: Status{Code: 7}, want: 7, str: "exit status 7"},
		{st: Status{Signal: syscall.SIGKILL}, want: 137, str: "killed by SIGKILL"},
		{st: Status{Signal: syscall.SIGTERM}, want: 143, str: "killed by SIGTERM"},
	}
	for _, tc := range cases {
		if got := tc.st.ExitCode(); got != tc.want {
			t.Errorf("%+v.ExitCode() = %d, want %d", tc.st, got, tc.want)
		}
		if got := tc.st.String(); got != tc.str {
			t.Errorf("%+v.String() = %q, want %q", tc.st, got, tc.str)
		}
	}
}
