package bench

import (
	"bufio"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
	"github.com/leaderrun/leaderrun/signals/watchdog"
)

// leaderruns are the leaderrun binaries measured: the one under test, then
// BENCH_COMPARE's, by the name the report gives them.
func (b *bench) leaderruns() []struct{ id, bin string } {
	out := []struct{ id, bin string }{{"leaderrun", b.lr}}
	for _, id := range b.res.compared {
		out = append(out, struct{ id, bin string }{id, b.res.bins[id]})
	}
	return out
}

// initBin is one process whose package init is measured: argv, and the
// exit status expected.
type initBin struct {
	id   string
	argv []string
	env  []string // added to the bench's, GODEBUG last
	code int
}

// watchdogInit is the id of leaderrun's watchdog in the init figures.
const watchdogInit = "leaderrun-watchdog"

// companionInit is the id of leaderrun-aws, which leaderrun becomes
// when the store is DynamoDB (the AWS SDK is linked into it only).
const companionInit = "leaderrun-aws"

// initBins are the processes whose package init is measured: every
// leaderrun binary's `version`, the watchdog of a run of the one under
// test on the local backend (the watchdog's init ends where the signals
// package takes it over), and the Go CLIs beside it (etcdctl, consul).
func (b *bench) initBins() []initBin {
	var bins []initBin
	for _, x := range b.leaderruns() {
		bins = append(bins, initBin{id: x.id, argv: []string{x.bin, "version"}})
	}
	bins = append(bins, initBin{id: companionInit, argv: []string{b.res.bins[companionInit], "version"}})
	// The watchdog alone: leaderrun re-executed as one, which exits 64
	// at its first check (fd 3 is no socket), after its packages' init. A
	// run's own watchdog starts during leaderrun's init: the two traces
	// would interleave.
	// Its environment as leaderrun gives it (signals' watchdogEnv).
	bins = append(bins, initBin{id: watchdogInit, argv: []string{b.lr, watchdog.Arg}, code: 64,
		env: []string{"GOMAXPROCS=1", "GODEBUG=memprofilerate=0,inittrace=1"}})
	return append(bins, initBin{id: "etcdctl", argv: []string{b.etcdctl, "version"}}, initBin{id: "consul", argv: []string{b.consul, "version"}})
}

// measureInit runs `BINARY version` with GODEBUG=inittrace=1, the binaries
// alternated run by run, and keeps each run's total package init time and
// allocation and each package's: what every start pays before main,
// whether or not it uses the package. The heap allocated during init
// stays in every instance's memory.
func (b *bench) measureInit() {
	bins := b.initBins()
	for i := range max(b.runs, 20) {
		for _, x := range rotate(bins, i) {
			cmd := exec.Command(x.argv[0], x.argv[1:]...)
			cmd.Env = append(append(b.baseEnv(), "GODEBUG=inittrace=1"), x.env...)
			out, err := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); err != nil && code != x.code || err == nil && x.code != 0 {
				b.t.Errorf("%v: %v, want exit %d\n%s", x.argv, err, x.code, out)
				continue
			}
			tr := parseInitTrace(string(out), 0)
			if tr.count == 0 {
				b.t.Errorf("%v with GODEBUG=inittrace=1 printed no init line:\n%s", x.argv, out)
				continue
			}
			b.res.sample(b.res.initTotal, x.id).add(tr.total)
			b.res.sample(b.res.initBytes, x.id).add(time.Duration(tr.bytes))
			b.res.mu.Lock()
			b.res.initCount[x.id] = tr.count
			b.res.mu.Unlock()
			for pkg, d := range tr.pkgs {
				b.res.sample(b.res.initPkg, x.id+" "+pkg).add(d)
				b.res.sample(b.res.initPkgBytes, x.id+" "+pkg).add(time.Duration(tr.pkgBytes[pkg]))
			}
		}
	}
}

// initTrace is what one GODEBUG=inittrace=1 run printed, summed.
type initTrace struct {
	total    time.Duration
	bytes    int // heap allocated by every package's init
	count    int // packages initialised
	pkgs     map[string]time.Duration
	pkgBytes map[string]int
}

// parseInitTrace reads the lines of GODEBUG=inittrace=1 of process
// proc of out (0: the first to print; a process that starts another one
// prints all its lines before the other's first): "init PKG @0.10 ms,
// 0.17 ms clock, 512 bytes, 3 allocs". The time after @ is since the
// process started: a line whose time is earlier than the one before it
// begins the next process.
func parseInitTrace(out string, proc int) initTrace {
	tr := initTrace{pkgs: map[string]time.Duration{}, pkgBytes: map[string]int{}}
	sc := bufio.NewScanner(strings.NewReader(out))
	n, last := 0, -1.0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 9 || f[0] != "init" || f[6] != "clock," || f[8] != "bytes," {
			continue
		}
		ms, err := strconv.ParseFloat(f[4], 64)
		if err != nil {
			continue
		}
		at, _ := strconv.ParseFloat(strings.TrimPrefix(f[2], "@"), 64)
		if at < last {
			n++
		}
		last = at
		if n != proc {
			continue
		}
		n, _ := strconv.Atoi(f[7])
		d := time.Duration(ms * float64(time.Millisecond))
		tr.pkgs[f[1]] += d
		tr.pkgBytes[f[1]] += n
		tr.total += d
		tr.bytes += n
		tr.count++
	}
	return tr
}

// slowInit is one package whose init took over 0.2 ms at the median.
type slowInit struct {
	pkg   string
	d     time.Duration
	bytes int // allocated, p50
}

// slowInits are the packages of binary id whose init takes over 0.2 ms
// at the median, slowest first.
func (r *results) slowInits(id string) []slowInit {
	var all []slowInit
	for k, s := range r.initPkg {
		if pkg, ok := strings.CutPrefix(k, id+" "); ok {
			// Runs where a package's init took no time print no line:
			// count them as zero.
			vals := slices.Clone(s.vals)
			for len(vals) < len(r.initTotal[id].vals) {
				vals = append(vals, 0)
			}
			if d := percentile(vals, .5); d > 200*time.Microsecond {
				all = append(all, slowInit{pkg, d, int(r.p50(r.initPkgBytes, k))})
			}
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].d > all[j].d })
	return all
}

// bytesText prints a byte count in KB or MB (decimal, as inittrace).
func bytesText(n int) string {
	if n >= 1e6 {
		return fmt.Sprintf("%.2f MB", float64(n)/1e6)
	}
	return fmt.Sprintf("%.0f KB", float64(n)/1e3)
}

// initTable is the report's package-init section: per binary, the total
// and the packages over 0.2 ms, side by side with etcdctl's and consul's.
func (r *results) initTable() string {
	var b strings.Builder
	b.WriteString("| binary | size | packages initialised | package init p50 / p90 | allocated by init, p50 | packages over 0.2 ms at the median (init time, allocated) |\n|---|---|---|---|---|---|\n")
	for _, id := range append(append([]string{"leaderrun"}, r.compared...), companionInit, watchdogInit, "etcdctl", "consul") {
		if r.initTotal[id] == nil {
			continue
		}
		var slow []string
		for _, s := range r.slowInits(id) {
			slow = append(slow, fmt.Sprintf("`%s` %s, %s", s.pkg, fmtDur(s.d), bytesText(s.bytes)))
		}
		if len(slow) == 0 {
			slow = []string{"none"}
		}
		size := r.sizes()[id]
		if id == watchdogInit {
			size = "(leaderrun's)"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s |\n", id, size, r.initCount[id], r.initTotal[id].pair(.9),
			bytesText(int(r.p50(r.initBytes, id))), strings.Join(slow, "; "))
	}
	return b.String()
}

// measureSize records each leaderrun binary's size, and what the code and
// data of the one under test are made of, by package: it builds the same
// source with the release's tags but with its symbol table (a release is
// stripped), and sums `go tool nm -size` by package.
func (b *bench) measureSize() {
	dir := b.t.TempDir()
	bin := filepath.Join(dir, "leaderrun-syms")
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-trimpath", "-tags=urfave_cli_no_docs", "-o", bin, ".")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.t.Errorf("build with symbols: %v\n%s", err, out)
		return
	}
	out, err := exec.Command("go", "tool", "nm", "-size", bin).Output()
	if err != nil {
		b.t.Errorf("go tool nm: %v", err)
		return
	}
	inFile, err := fileSections(bin)
	if err != nil {
		b.t.Errorf("read %s: %v", bin, err)
		return
	}
	b.res.pkgSize = sizeByPackage(string(out), inFile)
}

// fileSections reports, for an address, whether it lies in a section that
// takes room in the ELF file (not .bss or .noptrbss, which nm marks D all
// the same for some symbols).
func fileSections(bin string) (func(addr uint64) bool, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type span struct{ from, to uint64 }
	var spans []span
	for _, s := range f.Sections {
		if s.Type != elf.SHT_NOBITS && s.Flags&elf.SHF_ALLOC != 0 {
			spans = append(spans, span{s.Addr, s.Addr + s.Size})
		}
	}
	return func(addr uint64) bool {
		for _, s := range spans {
			if addr >= s.from && addr < s.to {
				return true
			}
		}
		return false
	}, nil
}

// sizeByPackage sums the sizes of the symbols in nm's output by package,
// counting only what takes room in the file.
func sizeByPackage(nm string, inFile func(uint64) bool) map[string]int {
	by := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(nm))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[2] == "U" {
			continue
		}
		addr, err1 := strconv.ParseUint(f[0], 16, 64)
		size, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil || !inFile(addr) {
			continue
		}
		by[symbolPackage(strings.Join(f[3:], " "))] += size
	}
	return by
}

// symbolPackage is the import path of the package a symbol belongs to:
// "github.com/a/b.(*T).M" → "github.com/a/b"; "type:*net/http.Client" →
// "net/http"; "go:itab.*os.File,io.Reader" → "os".
func symbolPackage(sym string) string {
	if strings.HasPrefix(sym, "go:func.") {
		return "(function metadata)"
	}
	for _, p := range []string{"type:", "go:itab.", "go:", "*", "[]", "map.", "gclocals·", "runtime.gcbits."} {
		sym = strings.TrimPrefix(sym, p)
	}
	sym = strings.TrimLeft(sym, "*[]")
	slash := strings.LastIndexByte(sym, '/')
	dot := strings.IndexByte(sym[slash+1:], '.')
	if dot < 0 {
		if slash < 0 {
			return "(runtime data)"
		}
		return sym
	}
	return sym[:slash+1+dot]
}

// module groups a package under the module it most likely comes from:
// the first three elements of a github.com path, the first two of
// golang.org/x/..., google.golang.org/..., go.etcd.io/..., go.uber.org/...;
// the standard library by its top directory.
func module(pkg string) string {
	parts := strings.Split(pkg, "/")
	switch {
	case strings.HasPrefix(pkg, "github.com/") && len(parts) >= 3:
		return strings.Join(parts[:3], "/")
	case strings.HasPrefix(pkg, "golang.org/x/") && len(parts) >= 3:
		return strings.Join(parts[:3], "/")
	case strings.Contains(parts[0], ".") && len(parts) >= 2:
		return strings.Join(parts[:2], "/")
	case strings.Contains(parts[0], "."), strings.HasPrefix(pkg, "("):
		return parts[0]
	}
	return "std: " + parts[0]
}

// sizeTable is the binary's code and data by module, largest first.
func (r *results) sizeTable() string {
	if len(r.pkgSize) == 0 {
		return ""
	}
	by := map[string]int{}
	total := 0
	for pkg, n := range r.pkgSize {
		by[module(pkg)] += n
		total += n
	}
	keys := make([]string, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return by[keys[i]] > by[keys[j]] })
	var b strings.Builder
	fmt.Fprintf(&b, "Code and data of the binary under test by module (`go tool nm -size` of the same build with its symbol table; %s in all; the 15 largest):\n\n| module | size |\n|---|---|\n", kib(total))
	for _, k := range keys[:min(15, len(keys))] {
		fmt.Fprintf(&b, "| %s | %s |\n", k, kib(by[k]))
	}
	return b.String()
}

func kib(n int) string { return fmt.Sprintf("%.0f KiB", float64(n)/1024) }

// smaps is what /proc/PID/smaps_rollup says of a process's resident set,
// in KiB, and /proc/PID/smaps by mapping.
type smaps struct {
	rss, anon, file int
	// byMapping is Rss by mapped file (base name), "[heap]", "[stack]",
	// "[anon]" for nameless anonymous mappings.
	byMapping map[string]int
}

func readSmaps(pid int) (smaps, error) {
	s := smaps{byMapping: map[string]int{}}
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "smaps_rollup"))
	if err != nil {
		return s, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "Rss:":
			s.rss = n
		case "Anonymous:":
			s.anon = n
		}
	}
	s.file = s.rss - s.anon
	data, err = os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "smaps"))
	if err != nil {
		return s, err
	}
	name := ""
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			name = "[anon]"
			if len(f) >= 6 {
				name = filepath.Base(f[5])
			}
		case len(f) >= 2 && f[0] == "Rss:":
			n, _ := strconv.Atoi(f[1])
			s.byMapping[name] += n
		}
	}
	return s, nil
}

// mappings prints byMapping, largest first, leaving out what is under
// 64 KiB.
func (s smaps) mappings() string {
	keys := make([]string, 0, len(s.byMapping))
	for k, v := range s.byMapping {
		if v >= 64 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return s.byMapping[keys[i]] > s.byMapping[keys[j]] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %s", k, mib(s.byMapping[k]))
	}
	return strings.Join(parts, ", ")
}

// startupDetails is the report's section on start-up, memory and size.
func (r *results) startupDetails() string {
	var b strings.Builder
	b.WriteString("\n### Start-up, memory and size\n\n")
	if len(r.initTotal) > 0 {
		fmt.Fprintf(&b, "Package init of each binary, from `GODEBUG=inittrace=1` of `BINARY version` (%d runs, the binaries alternated): every start pays it before `main`, whether or not it uses the package, and what it allocates stays in every instance's heap.\n\n", len(r.initTotal["leaderrun"].vals))
		b.WriteString(r.initTable())
		b.WriteString("\n")
	}
	ids := append([]string{"leaderrun"}, r.compared...)
	for _, id := range ids {
		if r.initTotal[id] == nil {
			continue
		}
		fmt.Fprintf(&b, "- `%s version` with `GODEBUG=inittrace=1` (%d runs, alternated): %d packages initialised, in %s (p50; p90 %s), allocating %s; the packages over 0.2 ms are in the table above. Minor page faults of `version`: %s (p50).\n",
			id, len(r.initTotal[id].vals), r.initCount[id], fmtDur(r.p50(r.initTotal, id)), fmtDur(percentile(r.initTotal[id].vals, .9)),
			bytesText(int(r.p50(r.initBytes, id))), faults(r.faults[id]))
	}
	for _, col := range storeColumns {
		if s := r.faults[col.lr.id]; s != nil {
			fmt.Fprintf(&b, "- %s, one whole run on a free lock: %s minor page faults (p50).\n", col.lr.name, faults(s))
		}
	}
	b.WriteString("\n")
	for _, col := range storeColumns {
		rec := r.rss[col.lr.id]
		if rec.wrapperSmaps.rss == 0 {
			continue
		}
		w, h := rec.wrapperSmaps, rec.helperSmaps
		fmt.Fprintf(&b, "- %s while leading: resident %s, of which anonymous %s and file-backed %s; by mapping: %s.", col.lr.name, mib(w.rss), mib(w.anon), mib(w.file), w.mappings())
		if h.rss > 0 {
			fmt.Fprintf(&b, " Its watchdog (%s): resident %s, anonymous %s", strings.Join(rec.helperNames, ", "), mib(h.rss), mib(h.anon))
			if m := h.mappings(); m != "" {
				fmt.Fprintf(&b, "; by mapping: %s", m)
			}
			b.WriteString(".")
		}
		b.WriteString("\n")
	}
	for _, col := range storeColumns {
		if rec, ok := r.rssLong[col.lr.id]; ok {
			fmt.Fprintf(&b, "- %s after %v of leadership renewing every %s (%d renewals, as many as %v at the default --retry-period): peak %s with its watchdog (%s alone), anonymous %s with its watchdog.\n",
				col.lr.name, longLeadFor, longRetry, int(longLeadFor/(100*time.Millisecond)), 20*longLeadFor, mib(rec.wrapper+rec.helpers), mib(rec.wrapper), mib(rec.anon()))
		}
	}
	b.WriteString("\n")
	b.WriteString(r.sizeTable())
	if len(r.compared) > 0 {
		b.WriteString("\nOther leaderrun builds, side by side with the one under test in the same run (BENCH_COMPARE; runs alternated):\n\n| column | start-to-child p50 / p90 | exec-to-exit p50 / p90 | peak RSS + watchdog | anonymous | binary | package init p50 |\n|---|---|---|---|---|---|---|\n")
		for _, col := range storeColumns {
			tools := []*tool{col.lr}
			for _, c := range r.compared {
				label := strings.TrimPrefix(c, "leaderrun@")
				tools = append(tools, &tool{id: col.lr.id + "-" + label, name: strings.Replace(col.lr.name, "leaderrun", c, 1)})
			}
			for i, tl := range tools {
				bin := ids[i]
				rec := r.rss[tl.id]
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", tl.name, r.s2c[tl.id].pair(.9), r.exit[tl.id].pair(.9),
					mib(rec.wrapper+rec.helpers), mib(rec.anon()), r.sizes()[bin], fmtDur(r.p50(r.initTotal, bin)))
			}
		}
	}
	return b.String()
}

func faults(s *sample) string {
	if s == nil || len(s.vals) == 0 {
		return "not measured"
	}
	return strconv.Itoa(int(percentile(s.vals, .5)))
}

// longLeadFor and longRetry make the long-leadership phase: 300 renewals,
// as many as ten minutes of leadership at the default --retry-period.
const (
	longLeadFor = 30 * time.Second
	longRetry   = "100ms"
)

// measureRSSLong leads with each leaderrun column for longLeadFor,
// renewing every longRetry, and reads the resident set of leaderrun and
// its watchdog at the end: what a long leadership costs, which the 3 s of
// measureRSS does not show (the Go runtime collects for the first time
// once its heap reaches 4 MiB).
func (b *bench) measureRSSLong() {
	procs := map[string]*proc{}
	for _, col := range storeColumns {
		tl := col.lr
		tag := tl.id + "-long"
		argv := tl.argv(b, tag, tag, b.addr(tl))
		dash := slices.Index(argv, "--")
		extra := []string{"--retry-period", longRetry}
		if col.name == "kubernetes" {
			// Renewals under a second apart let a client-go elector
			// take over a second early, so the Lease counts a second
			// less (backends/kubernetes): 9 s keeps it above the
			// deadline and the kill grace.
			extra = append(extra, "--lease-duration", "9s")
		}
		argv = slices.Concat(argv[:dash], extra, argv[dash:])
		p, err := b.spawn(tl, argv, tag, true)
		if err != nil {
			b.t.Error(err)
			continue
		}
		procs[tl.id] = p
	}
	kids := map[string]kid{}
	for id, p := range procs {
		if k, ok := b.hub.started(p.tag, 15*time.Second); ok {
			kids[id] = k
		} else {
			b.t.Errorf("%s: no child within 15 s:\n%s", id, p.tail())
		}
	}
	time.Sleep(longLeadFor) // leading: renewals every longRetry
	for id, p := range procs {
		k, ok := kids[id]
		if !ok {
			continue
		}
		var rec rssRec
		rec.wrapper, _, _ = testenv.Memory(p.pid())
		rec.wrapperSmaps, _ = readSmaps(p.pid())
		for _, d := range descendants(p.pid()) {
			if d == k.pid || slices.Contains(descendants(k.pid), d) {
				continue
			}
			h, _, err := testenv.Memory(d)
			if err == nil {
				rec.helpers += h
				rec.helperNames = append(rec.helperNames, argv0(d))
			}
			if sm, err := readSmaps(d); err == nil {
				rec.helperAnon += sm.anon
			}
		}
		b.res.rssLong[id] = rec
		p.stop(syscall.SIGTERM, 5*time.Second)
	}
}
