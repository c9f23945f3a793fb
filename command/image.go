package command

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
)

// maxScriptDepth is how many #! interpreters in a row Resolve follows, as
// Linux does (binfmt_script allows a few levels; macOS one).
const maxScriptDepth = 4

// magics are the binary formats Resolve knows: ELF (Linux, the BSDs) and
// Mach-O, thin and fat (macOS). Anything else without a "#!" line is
// refused: execve answers it with ENOEXEC (exit 126). Formats that only
// Linux's binfmt_misc runs (a JAR, a Windows binary under Wine) are
// refused too: run them through their interpreter, as the command itself.
var magics = [][]byte{
	[]byte("\x7fELF"),
	{0xfe, 0xed, 0xfa, 0xce}, {0xfe, 0xed, 0xfa, 0xcf},
	{0xce, 0xfa, 0xed, 0xfe}, {0xcf, 0xfa, 0xed, 0xfe},
	{0xca, 0xfe, 0xba, 0xbe},
}

// checkImage checks that the executable file at path can be started as
// the kernel would: a binary it knows, or a script whose "#!" interpreter
// exists and is executable itself. A file it cannot read is left to
// execve (an executable binary need not be readable).
func checkImage(path string, depth int) error {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	head := make([]byte, 256)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil
	}
	head = head[:n]
	for _, m := range magics {
		if bytes.HasPrefix(head, m) {
			return nil
		}
	}
	if !bytes.HasPrefix(head, []byte("#!")) {
		return &ExecError{Command: path, Reason: "not a binary and no #! line (exec format error): add a #! line, or run it with --shell or its interpreter",
			Err: ErrNotExecutable}
	}
	interp := interpreter(head[2:])
	if interp == "" {
		return &ExecError{Command: path, Reason: "its #! line names no interpreter", Err: ErrNotExecutable}
	}
	if depth >= maxScriptDepth {
		return &ExecError{Command: path, Reason: "too many #! interpreters in a row", Err: ErrNotExecutable}
	}
	fi, err := os.Stat(interp)
	switch {
	case err != nil:
		return &ExecError{Command: path, Reason: "interpreter " + interp + " (its #! line): no such file", Err: ErrNotFound}
	case fi.IsDir():
		return &ExecError{Command: path, Reason: "interpreter " + interp + " (its #! line): is a directory", Err: ErrNotExecutable}
	case fi.Mode()&0o111 == 0:
		return &ExecError{Command: path, Reason: "interpreter " + interp + " (its #! line): permission denied", Err: ErrNotExecutable}
	}
	return checkImage(interp, depth+1)
}

// interpreter is the path of a "#!" line (after the "#!"): its first word.
func interpreter(line []byte) string {
	if i := bytes.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	fields := strings.Fields(string(line))
	if len(fields) == 0 {
		return ""
	}
	return fields[0]
}
