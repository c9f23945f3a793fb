package consulapi

import (
	"errors"
	"net/http"
	"strings"
)

// Health check statuses.
const (
	HealthPassing  = "passing"
	HealthCritical = "critical"
)

// Agent is the local agent's check endpoints.
type Agent struct{ c *Client }

// Agent returns the agent endpoints.
func (c *Client) Agent() *Agent { return &Agent{c} }

// AgentCheck is a check as the agent lists it.
type AgentCheck struct {
	CheckID string
	Name    string
	Status  string
	Output  string
	Notes   string
}

// AgentCheckRegistration registers a TTL check on the agent's node.
type AgentCheckRegistration struct {
	ID     string
	Name   string
	Notes  string `json:",omitempty"`
	TTL    string
	Status string `json:",omitempty"`
}

// CheckRegister registers (or replaces) a check on the agent's node.
func (a *Agent) CheckRegister(reg *AgentCheckRegistration, w *WriteOptions) error {
	_, err := a.c.put("PUT", "/v1/agent/check/register", nil, reg, nil, w, nil)
	return err
}

// PassTTL marks TTL check id passing, which restarts its TTL.
func (a *Agent) PassTTL(id string, w *WriteOptions) error {
	_, err := a.c.put("PUT", "/v1/agent/check/pass/"+id, nil, nil, nil, w, nil)
	return err
}

// CheckDeregister removes check id from the agent, and from the catalog.
func (a *Agent) CheckDeregister(id string, w *WriteOptions) error {
	_, err := a.c.put("PUT", "/v1/agent/check/deregister/"+id, nil, nil, nil, w, nil)
	return err
}

// Checks lists the checks the agent runs, by ID.
func (a *Agent) Checks(q *QueryOptions) (map[string]*AgentCheck, error) {
	out := map[string]*AgentCheck{}
	_, err := a.c.get("/v1/agent/checks", nil, q, &out, false)
	return out, err
}

// IsUnknownCheck reports whether err is the agent's answer for a TTL check
// it does not have: 404 from newer agents, 500 "does not have associated
// TTL" from Consul 1.14.
func IsUnknownCheck(err error) bool {
	var se StatusError
	if !errors.As(err, &se) {
		return false
	}
	return se.Code == http.StatusNotFound || strings.Contains(se.Body, "does not have associated TTL") ||
		strings.Contains(strings.ToLower(se.Body), "unknown check")
}
