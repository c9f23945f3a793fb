// Command ddbemu is the DynamoDB emulator of leaderrun's tests: the HTTP
// server of github.com/truora/minidyn (an in-memory DynamoDB that
// implements GetItem, UpdateItem, CreateTable, TransactWriteItems with
// condition checks, condition expressions and ReturnValues, which is all
// that backends/dynamodb uses) behind a small front of its own that
//
//   - serves one request at a time: minidyn's table catalogue is not safe
//     for concurrent use, and one at a time makes every operation atomic;
//   - bounds request bodies (16 MiB);
//   - plays IAM for the tests of permissions: an access key id
//     "allow.A.B..." may perform only the actions A, B, ... (as IAM names
//     them: GetItem, UpdateItem, ConditionCheckItem, CreateTable, ...), and
//     "deny.A.B..." anything but them; any other key may do everything.
//     A refused request gets AccessDeniedException, worded as DynamoDB
//     words it. Signatures are not checked.
//
// It prints "listening ADDR" on standard output once it accepts
// connections, and exits on SIGTERM or SIGINT. State lives in memory
// only: a restart starts empty.
//
// It is a module of its own so that minidyn (and the test libraries its
// module requires) stay out of leaderrun's go.mod.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	miniserver "github.com/truora/minidyn/server"
)

const maxRequestBytes = 16 << 20

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "`ADDR` to listen on")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ddbemu:", err)
		os.Exit(1)
	}
	srv := &http.Server{Handler: &front{engine: miniserver.NewServer()}, ReadHeaderTimeout: 10 * time.Second}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		srv.Close()
	}()
	fmt.Printf("listening %s\n", ln.Addr())
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, "ddbemu:", err)
		os.Exit(1)
	}
}

// front serialises the requests to the engine and plays IAM.
type front struct {
	mu     sync.Mutex
	engine http.Handler
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBytes+1))
	if err != nil || len(body) > maxRequestBytes {
		writeError(w, http.StatusRequestEntityTooLarge, "ValidationException", "request too large or unreadable")
		return
	}
	op := r.Header.Get("X-Amz-Target")
	op = op[strings.LastIndexByte(op, '.')+1:]
	akid, region := credential(r.Header.Get("Authorization"))
	for _, action := range actions(op, body) {
		if !allowed(akid, action) {
			writeError(w, http.StatusBadRequest, "AccessDeniedException", fmt.Sprintf(
				"User: arn:aws:iam::000000000000:user/%s is not authorized to perform: dynamodb:%s on resource: "+
					"arn:aws:dynamodb:%s:000000000000:table/%s because no identity-based policy allows the dynamodb:%s action",
				akid, action, region, tableOf(body), action))
			return
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	f.mu.Lock()
	defer f.mu.Unlock()
	f.engine.ServeHTTP(w, r)
}

var credentialRE = regexp.MustCompile(`Credential=([^/,\s]+)/[^/]*/([^/]*)/`)

// credential is the access key id and the Region of a SigV4 Authorization
// header.
func credential(auth string) (akid, region string) {
	if m := credentialRE.FindStringSubmatch(auth); m != nil {
		return m[1], m[2]
	}
	return "anonymous", "us-east-1"
}

// actions are the IAM actions a request needs: a transaction needs the
// action of each of its parts, as DynamoDB authorizes it.
func actions(op string, body []byte) []string {
	switch op {
	case "TransactWriteItems":
		var in struct {
			TransactItems []map[string]json.RawMessage
		}
		_ = json.Unmarshal(body, &in)
		var acts []string
		for _, it := range in.TransactItems {
			for kind := range it {
				acts = append(acts, map[string]string{"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem",
					"ConditionCheck": "ConditionCheckItem"}[kind])
			}
		}
		return acts
	case "TransactGetItems":
		return []string{"GetItem"}
	}
	return []string{op}
}

// allowed applies the access key's policy (see the package doc).
func allowed(akid, action string) bool {
	kind, list, _ := strings.Cut(akid, ".")
	listed := false
	for _, a := range strings.Split(list, ".") {
		listed = listed || a == action
	}
	switch kind {
	case "allow":
		return listed
	case "deny":
		return !listed
	}
	return true
}

// tableOf is the table a request names, for the refusal's message.
func tableOf(body []byte) string {
	var in struct {
		TableName     string
		TransactItems []map[string]struct{ TableName string }
	}
	_ = json.Unmarshal(body, &in)
	for _, it := range in.TransactItems {
		for _, part := range it {
			return part.TableName
		}
	}
	return in.TableName
}

func writeError(w http.ResponseWriter, code int, typ, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": "com.amazonaws.dynamodb.v20120810#" + typ, "message": msg})
}
