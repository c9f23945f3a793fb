package cmd

import (
	"bytes"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestAzureBlobFlags: the Azure Blob flags and variables as a user meets
// them, through status and history. Bad input is exit 64 naming the flag
// or variable, before anything is contacted; no message ever shows a key,
// a SAS or a connection string; the AZURE_* variables alone select
// nothing. Accepted input reaches the store: a port where nothing
// listens is exit 69 naming the endpoint.
func TestAzureBlobFlags(t *testing.T) {
	for _, v := range []string{"LEADERRUN_AZURE_CONTAINER", "LEADERRUN_AZURE_ACCOUNT_URL", envAzureConnectionString, envAzureAccount,
		envAzureKey, envAzureSAS, "LEADERRUN_ETCD_ENDPOINTS", "ETCDCTL_ENDPOINTS", "LEADERRUN_CONSUL_ADDR", "CONSUL_HTTP_ADDR",
		"LEADERRUN_BACKEND", "LEADERRUN_ZK_SERVERS", "LEADERRUN_POSTGRES_URL"} {
		t.Setenv(v, "")
	}
	const (
		key = "c2VjcmV0LWtleS1vZi10aGUtdGVzdC1zZWNyZXQta2V5LW9mLXRoZS10ZXN0LTEyMzQ1Njc4OTA="
		sig = "s3cr3tSIGNATURE"
	)
	sas := "sv=2024-11-04&sr=c&sp=racwd&se=2099-01-01T00%3A00%3A00Z&sig=" + sig
	nowhere := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t, "127.0.0.1"))
	conn := "DefaultEndpointsProtocol=http;AccountName=acct;AccountKey=" + key + ";BlobEndpoint=http://" + nowhere + "/acct;"
	secrets := []string{key, sig, url.QueryEscape(key)}

	for _, tc := range []struct {
		name string
		args []string
		env  []string // NAME=value
		code int
		want []string // in stderr
	}{
		{"backend without container", []string{"--backend", "azureblob"}, nil, 64, []string{"--azure-container"}},
		{"bad container name", []string{"--azure-container", "Bad_Name"}, []string{envAzureConnectionString + "=" + conn}, 64,
			[]string{"--azure-container", "Bad_Name", "lowercase"}},
		{"no credentials", []string{"--azure-container", "locks"}, nil, 64, []string{envAzureConnectionString, envAzureKey, envAzureSAS}},
		{"account without key", []string{"--azure-container", "locks"}, []string{envAzureAccount + "=acct"}, 64, []string{"no credentials"}},
		{"bad account name", []string{"--azure-container", "locks"}, []string{envAzureAccount + "=Not_An_Account", envAzureKey + "=" + key}, 64,
			[]string{"storage account", "Not_An_Account"}},
		{"key not base64", []string{"--azure-container", "locks"}, []string{envAzureAccount + "=acct", envAzureKey + "=not*base64!"}, 64,
			[]string{"account key"}},
		{"account URL with a query", []string{"--azure-container", "locks", "--azure-account-url", "https://acct.blob.core.windows.net/?" + sas},
			[]string{envAzureKey + "=" + key}, 64, []string{"--azure-account-url", "https://acct.blob.core.windows.net/", envAzureSAS}},
		{"account URL and connection string", []string{"--azure-container", "locks", "--azure-account-url", "http://" + nowhere + "/acct"},
			[]string{envAzureConnectionString + "=" + conn}, 64, []string{"connection string"}},
		{"connection string without a key", []string{"--azure-container", "locks"},
			[]string{envAzureConnectionString + "=AccountName=acct"}, 64, []string{envAzureConnectionString, "AccountKey or SharedAccessSignature"}},
		{"prefix with a control character", []string{"--azure-container", "locks", "--prefix", "a\x01b"},
			[]string{envAzureConnectionString + "=" + conn}, 64, []string{"--prefix"}},
		{"connection string reaches the store", []string{"--azure-container", "locks"}, []string{envAzureConnectionString + "=" + conn}, 69,
			[]string{nowhere, "locks", "store unavailable"}},
		{"key reaches the store", []string{"--azure-container", "locks", "--azure-account-url", "http://" + nowhere + "/acct"},
			[]string{envAzureKey + "=" + key}, 69, []string{nowhere}},
		{"SAS reaches the store", []string{"--azure-container", "locks"},
			[]string{"LEADERRUN_AZURE_ACCOUNT_URL=http://" + nowhere + "/acct", envAzureSAS + "=?" + sas}, 69, []string{nowhere}},
		{"container from the environment", nil, []string{"LEADERRUN_AZURE_CONTAINER=locks", envAzureConnectionString + "=" + conn}, 69,
			[]string{nowhere}},
		{"AZURE variables alone select nothing", nil, []string{envAzureConnectionString + "=" + conn, envAzureAccount + "=acct", envAzureKey + "=" + key}, 64,
			[]string{"no store configured", "--azure-container"}},
		{"two stores", []string{"--azure-container", "locks", "--etcd-endpoints", "http://127.0.0.1:2379"},
			[]string{envAzureConnectionString + "=" + conn}, 64, []string{"several stores", "azureblob", "etcd"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, e := range tc.env {
				name, value, _ := strings.Cut(e, "=")
				t.Setenv(name, value)
			}
			for _, command := range []string{"status", "history"} {
				args := append([]string{"leaderrun", command, "--lock", "az-flags"}, tc.args...)
				var stdout, stderr bytes.Buffer
				code := run(args, &stdout, &stderr)
				out := stderr.String()
				if code != tc.code {
					t.Errorf("%s: exit %d, want %d; stderr:\n%s", command, code, tc.code, out)
				}
				for _, w := range tc.want {
					if !strings.Contains(out, w) {
						t.Errorf("%s: stderr does not say %q:\n%s", command, w, out)
					}
				}
				for _, s := range secrets {
					if strings.Contains(out+stdout.String(), s) {
						t.Errorf("%s: the output shows a secret:\n%s", command, out)
					}
				}
			}
		})
	}
}

// TestAzureBlobHelp: the Azure Blob flags are listed under the Store
// category of run's help, with the variables credentials come from and
// the lease durations Azure accepts.
func TestAzureBlobHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"leaderrun", "run", "--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("run --help: exit %d: %s", code, stderr.String())
	}
	help := stdout.String()
	store := help[strings.Index(help, "Store"):]
	for _, w := range []string{"--azure-container NAME", "LEADERRUN_AZURE_CONTAINER", "--azure-account-url URL", "LEADERRUN_AZURE_ACCOUNT_URL",
		envAzureConnectionString, envAzureKey, envAzureSAS, "15s-60s", "azureblob"} {
		if !strings.Contains(store, w) {
			t.Errorf("the Store section of run --help does not mention %q:\n%s", w, store)
		}
	}
}

// TestAzureBlobCredentialsNotPassed: the variables that carry the
// store's credentials are the ones removed from the command's
// environment; the account's name is no secret and stays.
func TestAzureBlobCredentialsNotPassed(t *testing.T) {
	want := []string{envAzureConnectionString, envAzureKey, envAzureSAS}
	if strings.Join(azureStore.credentials, ",") != strings.Join(want, ",") {
		t.Errorf("credentials removed: %v, want %v", azureStore.credentials, want)
	}
}
