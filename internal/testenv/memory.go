package testenv

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Memory reads the peak (VmHWM) and current (VmRSS) resident set of pid,
// in KiB, from /proc.
func Memory(pid int) (hwm, rss int, err error) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		n, _ := strconv.Atoi(fields[1])
		switch fields[0] {
		case "VmHWM:":
			hwm = n
		case "VmRSS:":
			rss = n
		}
	}
	return hwm, rss, sc.Err()
}
