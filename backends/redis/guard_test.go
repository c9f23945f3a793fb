package redis

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// TestRespScanner: streams of replies that a server sends, fed whole and
// split at every byte, are accepted or refused by the guard; a refusal
// comes no later than the header that breaks a bound.
func TestRespScanner(t *testing.T) {
	big := strings.Repeat("x", maxBulk)
	for _, tc := range []struct {
		name   string
		stream string
		ok     bool
	}{
		{"simple string", "+OK\r\n", true},
		{"empty simple string", "+\r\n", true},
		{"error", "-WRONGPASS invalid username-password pair\r\n", true},
		{"integer", ":42\r\n", true},
		{"null bulk", "$-1\r\n", true},
		{"empty bulk", "$0\r\n\r\n", true},
		{"bulk with CRLF inside", "$4\r\na\r\nb\r\n", true},
		{"bulk at the bound", "$1048576\r\n" + big + "\r\n", true},
		{"script reply", "*3\r\n:1\r\n$5\r\nvalue\r\n:15000\r\n", true},
		{"nested with nulls", "*5\r\n:0\r\n$-1\r\n:-2\r\n*0\r\n*-1\r\n", true},
		{"pub/sub message", "*3\r\n$7\r\nmessage\r\n$5\r\nwake:\r\n$4\r\nfree\r\n", true},
		{"several replies", "+OK\r\n:1\r\n$3\r\nabc\r\n*2\r\n+a\r\n+b\r\n", true},
		{"RESP3 hello", "%2\r\n$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:3\r\n", true},
		{"RESP3 scalars", "_\r\n,1.5\r\n#t\r\n(12345678901234567890\r\n!3\r\nERR\r\n=7\r\ntxt:abc\r\n", true},
		{"RESP3 set and push", "~2\r\n:1\r\n:2\r\n>3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\np\r\n", true},
		{"RESP3 attribute", "|1\r\n+key\r\n+val\r\n*1\r\n:1\r\n+next\r\n", true},
		{"bulk over the bound", "$1048577\r\n", false},
		{"huge bulk", "$8000000000\r\n", false},
		{"huge array", "*1000000000000\r\n", false},
		// Counts whose cost (count × elements per entry × elemCost)
		// wraps around int64 unless the bound is checked first.
		{"array whose cost wraps", "*999999999999999999\r\n", false},
		{"array whose cost wraps, to HELLO", "*999999999999999998\r\n$1\r\nx\r\n$1\r\ny\r\n", false},
		{"map whose cost wraps", "%999999999999999999\r\n", false},
		{"set whose cost wraps", "~576460752303423488\r\n", false},
		{"push whose cost wraps", ">999999999999999999\r\n", false},
		{"attribute whose cost wraps", "|288230376151711744\r\n+k\r\n+v\r\n:1\r\n", false},
		{"array just past the reply bound", "*" + strconv.Itoa(maxReply/elemCost+1) + "\r\n", false},
		{"strings that add up past the reply bound", "*2\r\n$1000000\r\n" + strings.Repeat("y", 1000000) + "\r\n$1000000\r\n" +
			strings.Repeat("y", 1000000) + "\r\n*9\r\n" + strings.Repeat("$1000000\r\n"+strings.Repeat("z", 1000000)+"\r\n", 9), false},
		{"too deep", strings.Repeat("*1\r\n", maxDepth+1) + ":1\r\n", false},
		{"as deep as allowed", strings.Repeat("*1\r\n", maxDepth) + ":1\r\n", true},
		{"long line", "+" + strings.Repeat("x", maxLine+1) + "\r\n", false},
		{"line without CR", "+OK\n", false},
		{"negative length", "$-2\r\n", false},
		{"signed length", "$+1\r\nx\r\n", false},
		{"leading zero", "*01\r\n:1\r\n", false},
		{"streamed string", "$?\r\n;1\r\nx\r\n;0\r\n", false},
		{"unknown type", "@1\r\n", false},
		{"HTTP", "HTTP/1.1 400 Bad Request\r\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var whole respScanner
			err := whole.feed([]byte(tc.stream))
			if (err == nil) != tc.ok {
				t.Fatalf("fed whole: %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, errHostileReply) {
				t.Errorf("error %v does not wrap errHostileReply", err)
			}
			if tc.ok && (len(whole.stack) != 0 || whole.bulk != 0 || whole.typ != 0 || whole.cost != 0) {
				t.Errorf("after complete replies the scanner is mid-reply: %+v", whole)
			}
			if len(tc.stream) > 1<<16 {
				return
			}
			var split respScanner
			var serr error
			for i := 0; i < len(tc.stream) && serr == nil; i++ {
				serr = split.feed([]byte{tc.stream[i]})
			}
			if (serr == nil) != tc.ok {
				t.Errorf("fed byte by byte: %v, want ok=%v", serr, tc.ok)
			}
		})
	}
}
