package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the longest a production function may be, from its func
// keyword to its closing brace: longer ones are split into named steps.
const maxFuncLines = 80

// TestFunctionLength: no function outside the tests, anywhere in the
// module, is longer than maxFuncLines. Nested modules (those with a
// go.mod of their own) are theirs to check.
func TestFunctionLength(t *testing.T) {
	var long []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || fileExists(filepath.Join(p, "go.mod"))) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		found, err := longFuncs(p, src)
		long = append(long, found...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range long {
		t.Errorf("%s: longer than %d lines; split it into named steps", f, maxFuncLines)
	}
}

// TestFunctionLengthCheck: the check finds a function one line too long,
// and a function literal too, and passes one of exactly the limit.
func TestFunctionLengthCheck(t *testing.T) {
	body := func(n int) string { return strings.Repeat("\t_ = 0\n", n-2) }
	src := "package p\n\nfunc ok() {\n" + body(maxFuncLines) + "}\n\nfunc long() {\n" + body(maxFuncLines+1) + "}\n\n" +
		"var lit = func() {\n" + body(maxFuncLines+1) + "}\n"
	found, err := longFuncs("p.go", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{fmt.Sprintf("p.go:%d: long (%d lines)", maxFuncLines+4, maxFuncLines+1),
		fmt.Sprintf("p.go:%d: function literal (%d lines)", 2*maxFuncLines+6, maxFuncLines+1)}
	if strings.Join(found, "\n") != strings.Join(want, "\n") {
		t.Errorf("found %q, want %q", found, want)
	}
}

// longFuncs lists the functions and function literals of a Go source
// file that are longer than maxFuncLines.
func longFuncs(path string, src []byte) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var long []string
	ast.Inspect(f, func(n ast.Node) bool {
		var body *ast.BlockStmt
		name := "function literal"
		switch n := n.(type) {
		case *ast.FuncDecl:
			body, name = n.Body, n.Name.Name
		case *ast.FuncLit:
			body = n.Body
		}
		if body == nil {
			return true
		}
		start := fset.Position(n.Pos()).Line
		if lines := fset.Position(body.Rbrace).Line - start + 1; lines > maxFuncLines {
			long = append(long, fmt.Sprintf("%s:%d: %s (%d lines)", path, start, name, lines))
		}
		return true
	})
	return long, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
