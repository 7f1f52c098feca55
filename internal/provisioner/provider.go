package provisioner

import (
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/providerhttp"
)

// Create starts a sandbox: a fresh id, POST /api/sandboxes (see
// CreateSandbox) with the thread id core.MetaThread and the user id
// ProvisionerUser(spec.Metadata) (tenant-qualified, so that two tenants'
// users never share a provisioner user's mounts), the metadata
// and env vars as extensions, then waits up to Timeouts.Ready for the AIO
// API (GET /v1/sandbox) to answer before handing the sandbox out.
// spec.Template and spec.Timeout are not used: the provisioner picks the
// image and pods have no expiry.
//
// Errors: as CreateSandbox; a sandbox that never becomes ready is deleted
// and reported as a certain *core.ProviderError (ambiguous if the delete
// failed too).
func (c *Client) Create(ctx context.Context, spec core.CreateSpec) (core.SandboxRef, error) {
	id, err := newSandboxID(c.opts.Deployment)
	if err != nil {
		return core.SandboxRef{}, err
	}
	sb, err := c.CreateSandbox(ctx, CreateRequest{
		SandboxID: id, ThreadID: spec.Metadata[core.MetaThread], UserID: ProvisionerUser(spec.Metadata),
		Metadata: spec.Metadata, Env: spec.EnvVars,
	})
	if err != nil {
		return core.SandboxRef{}, err
	}
	ref := core.SandboxRef{ID: sb.ID, Endpoint: core.Endpoint{Protocol: core.ProtocolAIO, URL: sb.URL, AccessToken: sb.AccessToken}}
	if err := c.WaitReady(ctx, ref); err != nil {
		return core.SandboxRef{}, c.refuseCreated(ctx, id, err)
	}
	return ref, nil
}

// ErrNoMetadata: the provisioner does not report sandbox metadata, so a
// listing filtered on it is unknowable (see List).
var ErrNoMetadata = errors.New("provisioner reports no sandbox metadata")

// ProvisionerUser is the provisioner user id of a broker sandbox:
// "<tenant>.<user>" when both core.MetaTenant and core.MetaUser are set
// (neither may contain a dot, so the pair is unambiguous), the user alone
// without a tenant, "" (DefaultUser) without a user.
func ProvisionerUser(md map[string]string) string {
	t, u := md[core.MetaTenant], md[core.MetaUser]
	switch {
	case u == "":
		return ""
	case t == "":
		return u
	default:
		return t + "." + u
	}
}

// newSandboxID returns "sbx-", the deployment tag and a dash when
// deployment is set, and 24 random hex digits: a valid Kubernetes name
// fragment and core sandbox id.
func newSandboxID(deployment string) (string, error) {
	b := make([]byte, 12)
	if _, err := crand.Read(b); err != nil {
		return "", fmt.Errorf("provisioner: sandbox id: %w", err)
	}
	prefix := "sbx-"
	if deployment != "" {
		prefix += deploymentTag(deployment) + "-"
	}
	return prefix + hex.EncodeToString(b), nil
}

// deploymentTag is the 8 hex digits of SHA-256(deployment) that sandbox
// ids carry (deployment ids may hold characters Kubernetes names may not).
func deploymentTag(deployment string) string {
	h := sha256.Sum256([]byte(deployment))
	return hex.EncodeToString(h[:4])
}

// Info reads GET /api/sandboxes/{id}. State is "running" for status
// Running, else the lower-cased status ("pending", …); EndAt is zero (no
// expiry). Metadata is the provisioner's (an extension of the local host)
// plus core.MetaThread, core.MetaTenant and core.MetaUser derived from
// thread_id and user_id (see ProvisionerUser) when not present.
//
// Errors: core.ErrSandboxGone on 404; else an ambiguous *core.ProviderError.
func (c *Client) Info(ctx context.Context, id string) (core.SandboxInfo, error) {
	if err := core.ValidateSandboxID(id); err != nil {
		return core.SandboxInfo{}, err
	}
	sb, err := c.GetSandbox(ctx, id)
	if err != nil {
		return core.SandboxInfo{}, err
	}
	return c.sandboxInfo(sb), nil
}

// sandboxInfo maps a provisioner sandbox to core.SandboxInfo, deriving
// core.MetaDeployment from the id when the provisioner kept no metadata
// and the id carries this client's deployment tag.
func (c *Client) sandboxInfo(sb Sandbox) core.SandboxInfo {
	md := maps.Clone(sb.Metadata)
	if md == nil {
		md = map[string]string{}
	}
	if d := c.opts.Deployment; d != "" {
		if _, ok := md[core.MetaDeployment]; !ok && strings.HasPrefix(sb.ID, "sbx-"+deploymentTag(d)+"-") {
			md[core.MetaDeployment] = d
		}
	}
	if _, ok := md[core.MetaThread]; !ok && sb.ThreadID != "" {
		md[core.MetaThread] = sb.ThreadID
	}
	if _, ok := md[core.MetaUser]; !ok && sb.UserID != "" && sb.UserID != DefaultUser {
		tenant, user, qualified := strings.Cut(sb.UserID, ".")
		if !qualified {
			user = sb.UserID
		} else if _, ok := md[core.MetaTenant]; !ok {
			md[core.MetaTenant] = tenant
		}
		md[core.MetaUser] = user
	}
	state := "running"
	if sb.Status != "" && sb.Status != "Running" {
		state = strings.ToLower(sb.Status)
	}
	return core.SandboxInfo{ID: sb.ID, Metadata: md, State: state}
}

// List reads GET /api/sandboxes and filters client-side (the provisioner
// cannot filter): every f.Metadata pair must match the sandbox's metadata
// (see Info), and with f.States set the state must be one of them. With
// f.States empty every listed sandbox is returned, pending ones included,
// so that a starting pod is never mistaken for a missing one.
//
// Errors: as ListSandboxes; and ErrNoMetadata (ambiguous) when the filter
// names a key other than core.MetaThread or core.MetaUser while a listed
// sandbox carries no metadata at all (a provisioner without the metadata
// extension): such a listing cannot prove a sandbox absent.
func (c *Client) List(ctx context.Context, f core.ListFilter) ([]core.SandboxInfo, error) {
	all, err := c.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	out := []core.SandboxInfo{}
	for _, sb := range all {
		if sb.Metadata == nil {
			for k := range f.Metadata {
				derived := k == core.MetaThread || k == core.MetaUser || k == core.MetaTenant ||
					(k == core.MetaDeployment && c.opts.Deployment != "")
				if !derived {
					return nil, providerhttp.WithCause(&core.ProviderError{Op: "list sandboxes", Ambiguous: true,
						Message: fmt.Sprintf("sandbox %s has no metadata to match %q", sb.ID, k)}, ErrNoMetadata)
				}
			}
		}
		info := c.sandboxInfo(sb)
		if len(f.States) > 0 && !slices.Contains(f.States, info.State) {
			continue
		}
		match := true
		for k, v := range f.Metadata {
			if got, ok := info.Metadata[k]; !ok || got != v {
				match = false
				break
			}
		}
		if match {
			out = append(out, info)
		}
	}
	return out, nil
}

// Kill deletes the sandbox (404 = already gone) and then waits up to
// Timeouts.KillConfirm for GET to report it absent, since pods terminate
// asynchronously: nil means confirmed gone.
//
// Errors: a *core.ProviderError; ambiguous when the delete or the
// confirmation did not complete.
func (c *Client) Kill(ctx context.Context, id string) error {
	if err := core.ValidateSandboxID(id); err != nil {
		return err
	}
	if err := c.DeleteSandbox(ctx, id); err != nil {
		return err
	}
	deadline := time.Now().Add(c.timeouts.KillConfirm)
	for {
		_, err := c.GetSandbox(ctx, id)
		if errors.Is(err, core.ErrSandboxGone) {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New("still present")
			}
			return &core.ProviderError{Op: "kill sandbox", Ambiguous: true,
				Message: fmt.Sprintf("sandbox %s not confirmed gone after %s: %v", id, c.timeouts.KillConfirm, err)}
		}
		if werr := sleepCtx(ctx, c.opts.PollInterval); werr != nil {
			return providerhttp.Transport("kill sandbox", werr)
		}
	}
}

// SetTimeout only confirms that the sandbox exists: provisioner pods have
// no expiry (the broker's reconcile pass ends idle sandboxes).
//
// Errors: core.ErrSandboxGone on 404; else as GetSandbox.
func (c *Client) SetTimeout(ctx context.Context, id string, _ time.Duration) error {
	if err := core.ValidateSandboxID(id); err != nil {
		return err
	}
	_, err := c.GetSandbox(ctx, id)
	return err
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
