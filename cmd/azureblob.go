package cmd

import (
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/azureblob"
)

// Environment variables of the Azure Blob backend's credentials, as the
// Azure CLI (az storage) and SDKs read them.
const (
	envAzureConnectionString = "AZURE_STORAGE_CONNECTION_STRING"
	envAzureAccount          = "AZURE_STORAGE_ACCOUNT"
	envAzureKey              = "AZURE_STORAGE_KEY"
	envAzureSAS              = "AZURE_STORAGE_SAS_TOKEN"
)

// azureFlags are the flags of the Azure Blob backend. Credentials come
// only from the environment, as az reads them: never from a flag, which
// every user of the host could read in ps. The AZURE_* variables never
// select the store: many hosts have them set for other programs.
func azureFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "azure-container", Category: categoryStore, EnvVars: []string{"LEADERRUN_AZURE_CONTAINER"},
			Usage: "Azure Blob Storage container `NAME` holding the lock's blobs (created if missing and allowed). Credentials as az reads them: " +
				envAzureConnectionString + ", or " + envAzureAccount + " with " + envAzureKey + " or " + envAzureSAS +
				"; Azure leases last 15s-60s (--lease-duration)"},
		&cli.StringFlag{Name: "azure-account-url", Category: categoryStore, EnvVars: []string{"LEADERRUN_AZURE_ACCOUNT_URL"},
			DefaultText: "https://$" + envAzureAccount + ".blob.core.windows.net",
			Usage:       "blob service `URL` of the storage account, for a sovereign cloud, a private endpoint or an emulator (http://127.0.0.1:10000/ACCOUNT); not with " + envAzureConnectionString},
	}
}

var azureStore = store{
	name:     "azureblob",
	flags:    azureFlags,
	selected: func(c *cli.Context) bool { return c.String("azure-container") != "" },
	open:     newAzureBackend,
	address:  "--azure-container (LEADERRUN_AZURE_CONTAINER)",
	// What would let a job write to the lock's blobs. AZURE_STORAGE_ACCOUNT
	// names the account and is no secret.
	credentials: []string{envAzureConnectionString, envAzureKey, envAzureSAS},
	risks:       azureRisks,
}

// newAzureBackend validates the Azure Blob flags and builds the backend.
// No message shows a key, a SAS or a connection string: the store's
// name the part that is wrong, never its value.
func newAzureBackend(c *cli.Context, cfg storeConfig) (backends.Store, error) {
	name := c.String("azure-container")
	if strings.TrimSpace(name) == "" {
		return nil, usageErrorf("--backend azureblob needs --azure-container (or LEADERRUN_AZURE_CONTAINER)")
	}
	if err := azureblob.ValidateContainer(name); err != nil {
		return nil, usageErrorf("--azure-container: %v", err)
	}
	if u := c.String("azure-account-url"); u != "" {
		if err := azureblob.ValidateAccountURL(u); err != nil {
			return nil, usageErrorf("--azure-account-url: %v", err)
		}
	}
	if err := azureblob.ValidatePrefix(cfg.Prefix); err != nil {
		return nil, usageErrorf("--prefix: %v", err)
	}
	log, err := newLogger(c, os.Stderr)
	if err != nil {
		return nil, err
	}
	s, err := azureblob.Open(azureblob.Config{
		AccountURL: c.String("azure-account-url"),
		Container:  name,
		Credentials: azureblob.Credentials{
			ConnectionString: os.Getenv(envAzureConnectionString),
			Account:          os.Getenv(envAzureAccount),
			Key:              os.Getenv(envAzureKey),
			SAS:              os.Getenv(envAzureSAS),
		},
		Prefix: cfg.Prefix,
		Log:    log,
	})
	if err != nil {
		// The store's message names the variable or flag at fault.
		return nil, usageErrorf("%v", err)
	}
	return s, nil
}
