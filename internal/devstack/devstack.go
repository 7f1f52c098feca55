// Package devstack runs the whole broker on loopback, the way it runs in AWS:
// DynamoDB Local, versitygw (S3), the local E2B-compatible sandbox host, and
// each Lambda function's real bootstrap binary under the AWS Lambda Runtime
// Interface Emulator, behind an HTTP front that serves the routes of
// template.yaml as API Gateway HTTP API (payload 2.0) events with a local
// bearer-token authorizer, and invokes scheduled functions at the template's
// rate. `make deps` (scripts/install-deps.sh, which pins the versions)
// installs the tools under .tools/: DynamoDB Local (Java 17+), versitygw
// and aws-lambda-rie.
package devstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
	"github.com/sandbox-broker/sandbox-broker/internal/standin"
)

// Defaults.
const (
	DefaultAddr   = "127.0.0.1:8787"
	DefaultTokens = "dev:dev-token"
	DefaultRegion = standin.Region
	DefaultTable  = "sandbox-broker"
	DefaultBucket = "sandbox-broker-outputs"
	DefaultPrefix = "outputs"
	// DefaultInstances is the number of emulator processes per HTTP
	// function (the emulator runs one invocation at a time).
	DefaultInstances = 3
)

// Options configure Start. Zero values mean the defaults.
type Options struct {
	// Root is the repository root: template.yaml, .tools/, .build/ and .run/
	// are found under it. Required.
	Root string
	// Template is the SAM template (default Root/template.yaml).
	Template string
	// BuildDir holds <function>/bootstrap (default Root/.build).
	BuildDir string
	// ToolsDir holds dynamodb/ and bin/{versitygw,aws-lambda-rie} (default Root/.tools).
	ToolsDir string
	// RunDir receives stack.json and logs/ (default Root/.run). Its
	// stack.json is removed by Close.
	RunDir string
	// Addr is where the HTTP API is served (default DefaultAddr; a port of
	// 0 picks a free one). Must be loopback.
	Addr string
	// DynamoDBAddr, S3Addr, SandboxAPIAddr and EnvdAddr place the stand-ins
	// ("" = a free 127.0.0.1 port).
	DynamoDBAddr, S3Addr, SandboxAPIAddr, EnvdAddr string
	// DynamoDBEndpoint is a DynamoDB Local already running, used instead
	// of starting one ("" = start one at DynamoDBAddr). The stack creates
	// a uniquely named table of its own there and deletes it on Close, so
	// that stacks in one test process share one server. It must run with
	// -sharedDb (standin.DynamoDBArgs): the stack and its functions use
	// different access keys.
	DynamoDBEndpoint string
	// Tokens maps bearer tokens to tenants (see ParseTokens); default
	// ParseTokens(DefaultTokens).
	Tokens map[string]string
	// TenantOrder is the order of the tenants in stack.json and the banner
	// (ParseTokenList keeps BROKER_DEV_TOKENS order); tenants of Tokens not
	// listed follow, sorted. Its first tenant is stack.json's
	// default_tenant, the one sbx uses when none is named.
	TenantOrder []string
	// FunctionEnv is added to every function's environment, after the
	// stack's own variables (so SANDBOX_* and LOG_LEVEL pass through; see
	// MakeRunEnv for what `make run` passes, including
	// BROKER_ADMIN_TENANTS).
	FunctionEnv []string
	// Instances per HTTP function (default DefaultInstances).
	Instances int
	// ScheduleOverride replaces every schedule's rate when > 0.
	ScheduleOverride time.Duration
	// Isolation of the sandbox host ("" = auto: bubblewrap when usable).
	Isolation string
	// SandboxLimits bound each sandbox of the sandbox host.
	SandboxLimits sandboxhost.Limits
	// Provider is the functions' SANDBOX_PROVIDER: "e2b" or "provisioner"
	// ("" = SANDBOX_PROVIDER from FunctionEnv, else "e2b"). The sandbox
	// host serves both faces either way.
	Provider string
	// ProvisionerAddr places the host's provisioner face ("" = a free
	// 127.0.0.1 port).
	ProvisionerAddr string
	// Logger receives the stack's own logs (default: discard).
	Logger *slog.Logger
}

// Info is the content of .run/stack.json: everything a client, a test or
// `aws --endpoint-url` needs to reach the stack.
type Info struct {
	APIURL string `json:"api_url"`
	// Tokens maps tenant -> token, written as a JSON object in
	// Options.TenantOrder (BROKER_DEV_TOKENS order under make run).
	Tokens TokenList `json:"tokens"`
	// DefaultTenant is the first tenant of Tokens: the one sbx uses when
	// none is named.
	DefaultTenant string `json:"default_tenant"`
	// AdminTenants are the functions' BROKER_ADMIN_TENANTS (may call
	// /v1/admin/drain and /v1/admin/undrain); empty when none.
	AdminTenants []string        `json:"admin_tenants"`
	S3           S3Info          `json:"s3"`
	DynamoDB     DynamoDBInfo    `json:"dynamodb"`
	SandboxHost  SandboxHostInfo `json:"sandbox_host"`
	// Provider is the functions' SANDBOX_PROVIDER (e2b or provisioner).
	Provider string `json:"provider"`
	// Provisioner addresses the sandbox host's provisioner face.
	Provisioner ProvisionerInfo `json:"provisioner"`
	// Events addresses the EventBridge stand-in and the file of the
	// events it received (.run/events.jsonl).
	Events    EventsInfo        `json:"events"`
	Functions map[string]string `json:"functions"` // name -> its Lambda Invoke API URL (queued as the stack's own invocations are)
	StartedAt time.Time         `json:"started_at"`
	PID       int               `json:"pid"`
	LogDir    string            `json:"log_dir"`
}

// S3Info addresses the local S3 (versitygw; path-style addressing).
type S3Info struct {
	Endpoint  string `json:"endpoint"`
	Region    string `json:"region"`
	AccessKey string `json:"access_key"`
	SecretKey string `json:"secret_key"`
	Bucket    string `json:"bucket"`
	Prefix    string `json:"prefix"`
}

// DynamoDBInfo addresses DynamoDB Local.
type DynamoDBInfo struct {
	Endpoint string `json:"endpoint"`
	Region   string `json:"region"`
	Table    string `json:"table"`
}

// SandboxHostInfo addresses the local E2B-compatible sandbox host.
type SandboxHostInfo struct {
	APIURL  string `json:"api_url"`
	EnvdURL string `json:"envd_url"`
	APIKey  string `json:"api_key"`
}

// ProvisionerInfo addresses the local provisioner API (the sandbox host's
// second face; sandbox URLs it hands out serve the AIO sandbox API).
type ProvisionerInfo struct {
	APIURL string `json:"api_url"`
	APIKey string `json:"api_key"`
}

// providerOf returns o.Provider, else the last SANDBOX_PROVIDER in env,
// else "e2b".
func providerOf(o Options) string {
	p := o.Provider
	if p == "" {
		for _, kv := range o.FunctionEnv {
			if v, ok := strings.CutPrefix(kv, "SANDBOX_PROVIDER="); ok {
				p = v
			}
		}
	}
	if p == "" {
		p = "e2b"
	}
	return p
}

// Stack is a running local stack. Stop it with Close.
type Stack struct {
	Info Info
	// StackFile is the path of the written stack.json.
	StackFile string

	log      *slog.Logger
	mu       sync.Mutex // guards children and tmpDirs while parts start in parallel
	children []*child
	host     *sandboxhost.Server
	hostLog  *os.File
	fns      map[string]*lambdaFn
	app      App
	srv      *http.Server
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	tmpDirs  []string
	failed   chan error // a child died
	failOnce sync.Once
	closeMu  sync.Once
	closeErr error
	// invokeLn is the local Lambda Invoke API's listener (invoke.go).
	invokeLn net.Listener
	// events is the EventBridge stand-in, recording into eventsFile (events.go).
	events     *http.Server
	eventsFile *os.File
	// tokenKey is the functions' TOKEN_LOCAL_KEY: made up at each start
	// (the table lives in memory, so nothing sealed outlives it), never
	// written to the stack file.
	tokenKey string
	// dropTable deletes the stack's table from a shared DynamoDB Local
	// (Options.DynamoDBEndpoint); nil when the stack started its own.
	dropTable func(context.Context) error
	// webhook is where the sandbox host sends its signed lifecycle
	// webhooks: the API's POST /webhooks/e2b, signed with a secret made up
	// at each start (the functions' BROKER_WEBHOOK_SECRET).
	webhook sandboxhost.Webhook
}

// Start brings the stack up and returns once every part answers and every
// function has initialised (a warm-up invocation, so configuration errors
// surface here). On error everything started is stopped. Cancelling ctx
// after Start returns does not stop the stack: call Close.
func Start(ctx context.Context, o Options) (_ *Stack, err error) {
	if o.Root == "" {
		return nil, errors.New("devstack: Options.Root is required")
	}
	root, err := filepath.Abs(o.Root)
	if err != nil {
		return nil, err
	}
	o.setDefaults(root)
	app, err := LoadTemplate(o.Template)
	if err != nil {
		return nil, err
	}
	t, err := findTools(o, app)
	if err != nil {
		return nil, err
	}
	// Bind the API address first: a taken BROKER_ADDR fails before anything starts.
	ln, err := listenAPI(o.Addr)
	if err != nil {
		return nil, err
	}
	served := false
	defer func() {
		if !served {
			ln.Close()
		}
	}()
	logDir := filepath.Join(o.RunDir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, fmt.Errorf("devstack: %w", err)
	}

	runCtx, cancel := context.WithCancel(context.Background())
	s := &Stack{log: o.Logger, fns: map[string]*lambdaFn{}, app: app, cancel: cancel, failed: make(chan error, 1),
		tokenKey: randomBase64(32),
		webhook:  sandboxhost.Webhook{URL: "http://" + ln.Addr().String() + "/webhooks/e2b", Secret: randomHex(24)}}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	s.Info = newInfo(o, logDir)
	if err := s.startServices(ctx, o, t, logDir); err != nil {
		return nil, fmt.Errorf("devstack: %w", err)
	}
	s.Info.Provider = providerOf(o)
	if err := s.startEvents(o.RunDir); err != nil {
		return nil, fmt.Errorf("devstack: %w", err)
	}
	if err := s.listenInvoke(); err != nil {
		return nil, fmt.Errorf("devstack: %w", err)
	}
	if err := s.startFunctions(ctx, o, t.rie, logDir); err != nil {
		return nil, fmt.Errorf("devstack: %w (logs in %s)", err, logDir)
	}
	for _, r := range app.Routes {
		if s.fns[r.Function] == nil {
			return nil, fmt.Errorf("devstack: route %s names unknown function %q", r.Key(), r.Function)
		}
	}
	served = true
	s.serveAPI(ln, o)
	s.serveInvoke(runCtx)
	s.startSchedules(runCtx, o)
	s.StackFile = filepath.Join(o.RunDir, "stack.json")
	if err := writeJSON(s.StackFile, s.Info); err != nil {
		return nil, fmt.Errorf("devstack: %w", err)
	}
	return s, nil
}

// listenAPI binds the API's loopback address (BROKER_ADDR).
func listenAPI(want string) (net.Listener, error) {
	addr, _, err := loopbackAddr(want)
	if err != nil {
		return nil, fmt.Errorf("devstack: BROKER_ADDR: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("devstack: listen on %s: %w (set BROKER_ADDR to another port)", addr, err)
	}
	return ln, nil
}

// newInfo is the stack file's content before anything starts.
func newInfo(o Options, logDir string) Info {
	info := Info{
		Tokens:       orderTokens(o.Tokens, o.TenantOrder),
		AdminTenants: adminTenants(o.FunctionEnv),
		Functions:    map[string]string{},
		StartedAt:    time.Now().UTC(),
		PID:          os.Getpid(),
		LogDir:       logDir,
	}
	if len(info.Tokens) > 0 {
		info.DefaultTenant = info.Tokens[0].Tenant
	}
	return info
}

// setDefaults fills the options left empty, paths under root.
func (o *Options) setDefaults(root string) {
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&o.Template, filepath.Join(root, "template.yaml"))
	def(&o.BuildDir, filepath.Join(root, ".build"))
	def(&o.ToolsDir, filepath.Join(root, ".tools"))
	def(&o.RunDir, filepath.Join(root, ".run"))
	def(&o.Addr, DefaultAddr)
	if o.Tokens == nil {
		o.Tokens, _ = ParseTokens(DefaultTokens)
	}
	if o.Instances <= 0 {
		o.Instances = DefaultInstances
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// tools are the programs the stack runs.
type tools struct {
	rie, versitygw, dynamoDir, java string
}

// findTools checks that the tools (make deps) and the functions' bootstraps
// (make build) are there.
func findTools(o Options, app App) (tools, error) {
	t := tools{
		rie:       filepath.Join(o.ToolsDir, "bin", "aws-lambda-rie"),
		versitygw: filepath.Join(o.ToolsDir, "bin", "versitygw"),
		dynamoDir: filepath.Join(o.ToolsDir, "dynamodb"),
	}
	need := []string{t.rie, t.versitygw}
	if o.DynamoDBEndpoint == "" {
		need = append(need, filepath.Join(t.dynamoDir, "DynamoDBLocal.jar"))
	}
	for _, p := range need {
		if _, err := os.Stat(p); err != nil {
			return tools{}, fmt.Errorf("devstack: %s missing: run make deps", p)
		}
	}
	for _, f := range app.Functions {
		if _, err := os.Stat(filepath.Join(o.BuildDir, f.Name, "bootstrap")); err != nil {
			return tools{}, fmt.Errorf("devstack: %s missing: run make build", filepath.Join(o.BuildDir, f.Name, "bootstrap"))
		}
	}
	if o.DynamoDBEndpoint != "" {
		return t, nil
	}
	java, err := exec.LookPath("java")
	if err != nil {
		return tools{}, fmt.Errorf("devstack: java missing (DynamoDB Local needs Java 17+): %w", err)
	}
	t.java = java
	return t, nil
}

// startServices starts DynamoDB Local, versitygw and the sandbox host (with
// its provisioner face) side by side.
func (s *Stack) startServices(ctx context.Context, o Options, t tools, logDir string) error {
	var (
		wg                   sync.WaitGroup
		ddbErr, s3Err, shErr error
	)
	wg.Add(3)
	go func() {
		defer wg.Done()
		if o.DynamoDBEndpoint != "" {
			ddbErr = s.useDynamoDB(ctx, o.DynamoDBEndpoint)
			return
		}
		ddbErr = s.startDynamoDB(ctx, t.java, t.dynamoDir, o.DynamoDBAddr, logDir)
	}()
	go func() { defer wg.Done(); s3Err = s.startS3(ctx, t.versitygw, o.S3Addr, logDir) }()
	go func() {
		defer wg.Done()
		shErr = s.startSandboxHost(ctx, o, logDir)
		if shErr == nil {
			shErr = s.startProvisioner(o.ProvisionerAddr)
		}
	}()
	wg.Wait()
	return errors.Join(ddbErr, s3Err, shErr)
}

// startFunctions starts one emulator pool per function (one instance for
// a function that only runs on a schedule) and warms them up in parallel.
func (s *Stack) startFunctions(ctx context.Context, o Options, rie, logDir string) error {
	env := s.functionEnv(o.FunctionEnv)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, f := range s.app.Functions {
		n := o.Instances
		if len(f.Schedules) > 0 && !hasRoutes(s.app, f.Name) {
			n = 1
		}
		wg.Add(1)
		go func(f Function, n int) {
			defer wg.Done()
			lf, err := startFunction(ctx, f, n, fnLaunch{rie: rie, bootstrap: filepath.Join(o.BuildDir, f.Name, "bootstrap"), logDir: logDir, env: env})
			if err == nil {
				lf.log = s.log
				err = warmUp(ctx, lf)
			}
			mu.Lock()
			defer mu.Unlock()
			if lf != nil {
				s.fns[f.Name] = lf
				s.Info.Functions[f.Name] = s.functionURL(f.Name)
			}
			if err != nil {
				errs = append(errs, err)
			}
		}(f, n)
	}
	wg.Wait()
	return errors.Join(errs...)
}

// serveAPI serves the HTTP API on ln (listening since Start began).
func (s *Stack) serveAPI(ln net.Listener, o Options) {
	s.Info.APIURL = "http://" + ln.Addr().String()
	gw := &gateway{app: s.app, fns: s.fns, tokens: o.Tokens, log: o.Logger, region: DefaultRegion, apiHost: ln.Addr().String()}
	s.srv = &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 4 * maxRequestHead}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.fail(fmt.Errorf("http api: %w", err))
		}
	}()
}

// startSchedules invokes the scheduled functions at their rates (or
// o.ScheduleOverride) until runCtx ends, and watches the children.
func (s *Stack) startSchedules(runCtx context.Context, o Options) {
	for _, f := range s.app.Functions {
		for _, rate := range f.Schedules {
			if o.ScheduleOverride > 0 {
				rate = o.ScheduleOverride
			}
			s.wg.Add(1)
			go s.schedule(runCtx, s.fns[f.Name], rate)
		}
	}
	s.wg.Add(1)
	go s.watch(runCtx)
}

func (s *Stack) addChild(c *child) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.children = append(s.children, c)
}

func (s *Stack) addTmpDir(d string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tmpDirs = append(s.tmpDirs, d)
}

func hasRoutes(app App, fn string) bool {
	for _, r := range app.Routes {
		if r.Function == fn {
			return true
		}
	}
	return false
}

// warmUp invokes every instance once so each function initialises (and
// fails here on bad configuration): HTTP functions with a request no route
// matches (answered without touching state), scheduled-only functions with
// a scheduled event (one reconcile pass on an empty table).
func warmUp(ctx context.Context, lf *lambdaFn) error {
	payload := []byte(`{"version":"2.0","routeKey":"$default","rawPath":"/__devstack/warmup","requestContext":{"http":{"method":"GET","path":"/__devstack/warmup"},"requestId":"devstack-warmup"}}`)
	if len(lf.fn.Schedules) > 0 {
		payload = scheduledEvent(lf.fn, time.Now())
	}
	errs := make(chan error, len(lf.instances))
	for range lf.instances {
		go func() {
			ctx, cancel := context.WithTimeout(ctx, lf.fn.Timeout+30*time.Second)
			defer cancel()
			_, err := lf.invoke(ctx, payload)
			errs <- err
		}()
	}
	var all []error
	for range lf.instances {
		if err := <-errs; err != nil {
			all = append(all, fmt.Errorf("warm-up: %w", err))
		}
	}
	return errors.Join(all...)
}

// scheduledEvent is an EventBridge "Scheduled Event".
func scheduledEvent(f Function, now time.Time) []byte {
	b, _ := json.Marshal(map[string]any{
		"version": "0", "id": uuid.NewString(), "detail-type": "Scheduled Event", "source": "aws.events",
		"account": "000000000000", "time": now.UTC().Format(time.RFC3339), "region": DefaultRegion,
		"resources": []string{"arn:aws:events:" + DefaultRegion + ":000000000000:rule/devstack-" + f.LogicalID},
		"detail":    map[string]any{},
	})
	return b
}

// InvokeScheduled runs a scheduled function once now (as its schedule would)
// and returns its response payload.
func (s *Stack) InvokeScheduled(ctx context.Context, function string) ([]byte, error) {
	lf := s.fns[function]
	if lf == nil {
		return nil, fmt.Errorf("%w: %q", errNoFunction, function)
	}
	return lf.invoke(ctx, scheduledEvent(lf.fn, time.Now()))
}

func (s *Stack) schedule(ctx context.Context, lf *lambdaFn, rate time.Duration) {
	defer s.wg.Done()
	t := time.NewTicker(rate)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			out, err := lf.invoke(ctx, scheduledEvent(lf.fn, now))
			if err != nil {
				if ctx.Err() == nil {
					s.log.Error("scheduled invocation failed", "function", lf.fn.Name, "error", err.Error())
				}
				continue
			}
			s.log.Info("scheduled invocation", "function", lf.fn.Name, "result", truncate(string(out), 500))
		}
	}
}

// watch reports the first of the stack's own services (DynamoDB Local
// when the stack started it, versitygw, the sandbox host) that dies: the
// stack cannot go on without it. A function's emulator is not watched:
// the next invocation that finds it dead starts it again
// (lambdaFn.invoke), as Lambda replaces a crashed execution environment.
func (s *Stack) watch(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, c := range s.children {
			select {
			case <-c.exited:
				s.fail(fmt.Errorf("%s exited (%v)", c.name, c.cmd.ProcessState))
				return
			default:
			}
		}
	}
}

func (s *Stack) fail(err error) {
	s.failOnce.Do(func() { s.failed <- err })
}

// Failed delivers an error when a part of the stack dies unexpectedly.
func (s *Stack) Failed() <-chan error { return s.failed }

// Close stops everything the stack started: the HTTP API, schedules, the
// emulators (process groups, SIGTERM then SIGKILL), the sandbox host (which
// kills its sandboxes), versitygw and DynamoDB Local; it removes temporary
// directories and stack.json, and, last, the stack's table on a shared
// DynamoDB Local (Options.DynamoDBEndpoint). Safe to call more than once.
func (s *Stack) Close() error {
	s.closeMu.Do(func() {
		var errs []error
		if s.srv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := s.srv.Shutdown(ctx); err != nil {
				_ = s.srv.Close()
			}
			cancel()
		}
		s.cancel()
		if s.invokeLn != nil {
			_ = s.invokeLn.Close() // served or not: no invocation starts past here
		}
		var wg sync.WaitGroup
		for _, lf := range s.fns {
			wg.Add(1)
			go func(lf *lambdaFn) { defer wg.Done(); lf.stop() }(lf)
		}
		wg.Wait()
		if err := s.closeEvents(); err != nil {
			errs = append(errs, fmt.Errorf("events file: %w", err))
		}
		if s.host != nil {
			if err := s.host.Close(); err != nil {
				errs = append(errs, fmt.Errorf("sandbox host: %w", err))
			}
			s.hostLog.Close()
		}
		for _, c := range s.children {
			wg.Add(1)
			go func(c *child) { defer wg.Done(); c.stop(3 * time.Second) }(c)
		}
		wg.Wait()
		s.wg.Wait()
		if s.dropTable != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := s.dropTable(ctx); err != nil {
				errs = append(errs, fmt.Errorf("dynamodb: %w", err))
			}
			cancel()
		}
		for _, d := range s.tmpDirs {
			if err := os.RemoveAll(d); err != nil {
				errs = append(errs, err)
			}
		}
		if s.StackFile != "" {
			_ = os.Remove(s.StackFile)
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// writeJSON writes v to file atomically, readable by the owner only (it
// holds credentials).
func writeJSON(file string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

// S3ListCommand is an AWS CLI command that lists the stack's bucket as is:
// the local S3's throwaway credentials and region are given inline, so it
// needs no AWS configuration.
func (s *Stack) S3ListCommand() string {
	i := s.Info.S3
	return fmt.Sprintf("AWS_ACCESS_KEY_ID=%s AWS_SECRET_ACCESS_KEY=%s AWS_DEFAULT_REGION=%s aws --endpoint-url %s s3 ls --recursive s3://%s/",
		i.AccessKey, i.SecretKey, i.Region, i.Endpoint, i.Bucket)
}

// Banner is a short human summary of the running stack.
func (s *Stack) Banner(startupTime time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "sandbox-broker dev stack ready in %.1fs (started %s)\n", startupTime.Seconds(), s.Info.StartedAt.Format(time.RFC3339))
	fmt.Fprintf(&b, "  API          %s\n", s.Info.APIURL)
	admin := map[string]bool{}
	for _, t := range s.Info.AdminTenants {
		admin[t] = true
	}
	for i, t := range s.Info.Tokens {
		var notes []string
		if i == 0 {
			notes = append(notes, "sbx default")
		}
		if admin[t.Tenant] {
			notes = append(notes, "admin: may drain")
		}
		note := ""
		if len(notes) > 0 {
			note = " (" + strings.Join(notes, ", ") + ")"
		}
		fmt.Fprintf(&b, "  token        %s -> Authorization: Bearer %s%s\n", t.Tenant, t.Token, note)
	}
	fmt.Fprintf(&b, "  S3           %s  bucket %s\n", s.Info.S3.Endpoint, s.Info.S3.Bucket)
	fmt.Fprintf(&b, "               %s\n", s.S3ListCommand())
	fmt.Fprintf(&b, "  DynamoDB     %s  table %s\n", s.Info.DynamoDB.Endpoint, s.Info.DynamoDB.Table)
	fmt.Fprintf(&b, "  sandbox host %s (envd %s)\n", s.Info.SandboxHost.APIURL, s.Info.SandboxHost.EnvdURL)
	fmt.Fprintf(&b, "  provisioner  %s (functions use SANDBOX_PROVIDER=%s)\n", s.Info.Provisioner.APIURL, s.Info.Provider)
	fmt.Fprintf(&b, "  stack file   %s\n", s.StackFile)
	fmt.Fprintf(&b, "  logs         %s\n", s.Info.LogDir)
	fmt.Fprintf(&b, "  events       %s (lifecycle events, one JSON object a line)\n", s.Info.Events.File)
	b.WriteString("Ctrl-C stops everything.\n")
	return b.String()
}
