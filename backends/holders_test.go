package backends

import "testing"

func TestHoldersRecord(t *testing.T) {
	for _, tc := range []struct {
		holders, recorded int
	}{{-1, 0}, {0, 0}, {1, 0}, {2, 2}, {3, 3}, {1000, 1000}} {
		got := CampaignOptions{Holders: tc.holders}.RecordedHolders()
		if got != tc.recorded {
			t.Errorf("Holders %d records %d, want %d", tc.holders, got, tc.recorded)
		}
	}
	for _, tc := range []struct {
		s    string
		want int
	}{{"", 0}, {"0", 0}, {"1", 0}, {"2", 2}, {"37", 37}, {"-3", 0}, {"x", 0}, {"3 ", 0}, {"99999999999999999999999", 0}} {
		if got := ParseHolders(tc.s); got != tc.want {
			t.Errorf("ParseHolders(%q) = %d, want %d", tc.s, got, tc.want)
		}
	}
}
