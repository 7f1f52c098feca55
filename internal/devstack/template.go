package devstack

import (
	"errors"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/awslabs/goformation/v7/cloudformation"
	"github.com/awslabs/goformation/v7/cloudformation/serverless"
)

// Route is one HTTP API route of the SAM template.
type Route struct {
	Method   string // upper case, or "ANY"
	Path     string // e.g. /v1/sandboxes/{id}/release
	Function string // function name (the CodeUri directory name, e.g. "release")
	// TokenHeader is the request header carrying the caller's token: the
	// identity source of the route's authorizer (its own Auth.Authorizer,
	// else the API's DefaultAuthorizer), "Authorization" when none says;
	// NoAuthorizer for a route whose Auth.Authorizer is NONE (it
	// authenticates its callers itself).
	TokenHeader string
}

// Key is the API Gateway route key, "METHOD /path".
func (r Route) Key() string { return r.Method + " " + r.Path }

// Function is one Lambda function of the SAM template.
type Function struct {
	Name      string // CodeUri directory name, e.g. "acquire"
	LogicalID string
	// Timeout is the function's Timeout, else Globals.Function's, else
	// SAM's default of 3 s.
	Timeout time.Duration
	// MemoryMB is the function's MemorySize, else Globals.Function's, else 128.
	MemoryMB int
	// Schedules are the rates of its Schedule events.
	Schedules []time.Duration
	// Env is the template's environment for the function (Globals.Function
	// merged with its own), parameters resolved to their defaults; entries
	// that resolve to "" (resource references, parameters without default)
	// are left out. Sorted "KEY=value" entries.
	Env []string
}

// App is what devstack needs from template.yaml: functions, routes and
// schedules, as `sam local start-api` would read them.
type App struct {
	Functions []Function // sorted by name
	Routes    []Route
}

// LoadTemplate parses a SAM template with goformation (OpenTemplate). Functions are named
// by the last element of their CodeUri (".build/acquire/" -> "acquire").
// Routes come from HttpApi (and Api) events; schedules from Schedule events
// with rate(...) expressions (cron expressions are an error: devstack
// cannot run them).
func LoadTemplate(file string) (App, error) {
	tpl, err := OpenTemplate(file)
	if err != nil {
		return App{}, fmt.Errorf("parse %s: %w", file, err)
	}
	var app App
	seen := map[string]string{}
	var auth apiAuth
	if auth.headers, auth.def, err = authorizers(tpl); err != nil {
		return App{}, err
	}
	defaults := globalFunction(tpl)
	for id, fn := range tpl.GetAllServerlessFunctionResources() {
		name, err := functionName(id, fn)
		if err != nil {
			return App{}, err
		}
		if other, dup := seen[name]; dup {
			return App{}, fmt.Errorf("functions %s and %s share CodeUri directory %q", other, id, name)
		}
		seen[name] = id
		f := defaults.function(id, name, fn)
		routes, err := readEvents(id, &f, fn, auth)
		if err != nil {
			return App{}, err
		}
		app.Routes = append(app.Routes, routes...)
		app.Functions = append(app.Functions, f)
	}
	sort.Slice(app.Functions, func(i, j int) bool { return app.Functions[i].Name < app.Functions[j].Name })
	sort.Slice(app.Routes, func(i, j int) bool { return app.Routes[i].Key() < app.Routes[j].Key() })
	for i := 1; i < len(app.Routes); i++ {
		if app.Routes[i].Key() == app.Routes[i-1].Key() {
			return App{}, fmt.Errorf("route %s is declared twice", app.Routes[i].Key())
		}
	}
	if len(app.Functions) == 0 {
		return App{}, fmt.Errorf("%s declares no AWS::Serverless::Function", file)
	}
	return app, nil
}

// fnDefaults are the template's Globals.Function settings, over SAM's own
// defaults (goformation does not merge Globals).
type fnDefaults struct {
	timeout time.Duration
	memory  int
	env     map[string]string
}

func globalFunction(tpl *cloudformation.Template) fnDefaults {
	d := fnDefaults{timeout: 3 * time.Second, memory: 128, env: map[string]string{}} // SAM's own defaults
	g, err := tpl.GetServerlessGlobalFunction()
	if err != nil {
		return d
	}
	if g.Environment != nil {
		for k, v := range g.Environment.Variables {
			d.env[k] = v
		}
	}
	if g.Timeout != nil && *g.Timeout > 0 {
		d.timeout = time.Duration(*g.Timeout) * time.Second
	}
	if g.MemorySize != nil && *g.MemorySize > 0 {
		d.memory = *g.MemorySize
	}
	return d
}

// function is the Function of resource id named name: its timeout, memory
// and environment (the function's variables over the global ones; empty
// values are left out).
func (d fnDefaults) function(id, name string, fn *serverless.Function) Function {
	f := Function{Name: name, LogicalID: id, Timeout: d.timeout, MemoryMB: d.memory}
	if fn.Timeout != nil && *fn.Timeout > 0 {
		f.Timeout = time.Duration(*fn.Timeout) * time.Second
	}
	if fn.MemorySize != nil && *fn.MemorySize > 0 {
		f.MemoryMB = *fn.MemorySize
	}
	env := map[string]string{}
	for k, v := range d.env {
		env[k] = v
	}
	if fn.Environment != nil {
		for k, v := range fn.Environment.Variables {
			env[k] = v
		}
	}
	for k, v := range env {
		if v != "" {
			f.Env = append(f.Env, k+"="+v)
		}
	}
	sort.Strings(f.Env)
	return f
}

// apiAuth is what the HTTP APIs declare of their authorizers (authorizers).
type apiAuth struct {
	headers map[string]string // authorizer name -> its token header
	def     string            // the default authorizer, "" when none
}

// readEvents returns the routes of fn's HttpApi and Api events (each with
// the token header of its authorizer) and adds the rates of its enabled
// Schedule events to f.
func readEvents(id string, f *Function, fn *serverless.Function, auth apiAuth) ([]Route, error) {
	evNames := make([]string, 0, len(fn.Events))
	for n := range fn.Events {
		evNames = append(evNames, n)
	}
	sort.Strings(evNames)
	var routes []Route
	for _, evName := range evNames {
		ev := fn.Events[evName]
		if ev.Properties == nil {
			continue
		}
		switch ev.Type {
		case "HttpApi", "Api":
			r, err := readRoute(id, evName, ev, auth)
			if err != nil {
				return nil, err
			}
			r.Function = f.Name
			routes = append(routes, r)
		case "Schedule":
			e := ev.Properties.ScheduleEvent
			if e == nil {
				return nil, fmt.Errorf("%s event %s: no Schedule", id, evName)
			}
			if e.Enabled != nil && !*e.Enabled {
				continue
			}
			d, err := ParseRate(e.Schedule)
			if err != nil {
				return nil, fmt.Errorf("%s event %s: %w", id, evName, err)
			}
			f.Schedules = append(f.Schedules, d)
		}
	}
	return routes, nil
}

// readRoute reads an HttpApi or Api event: method, path and the token
// header of its authorizer (its own, else the API's default;
// "Authorization" when none says).
func readRoute(id, evName string, ev serverless.Function_EventSource, auth apiAuth) (Route, error) {
	// goformation fills ApiEvent and HttpApiEvent alike; read by Type.
	var method, p *string
	authz := auth.def
	if e := ev.Properties.HttpApiEvent; e != nil && ev.Type == "HttpApi" {
		method, p = e.Method, e.Path
		if e.Auth != nil && e.Auth.Authorizer != nil {
			authz = *e.Auth.Authorizer
		}
	} else if e := ev.Properties.ApiEvent; e != nil {
		m, pp := e.Method, e.Path
		method, p = &m, &pp
	}
	if method == nil || p == nil || *p == "" {
		return Route{}, fmt.Errorf("%s event %s: Method and Path are required here", id, evName)
	}
	header := "Authorization"
	if authz == NoAuthorizer {
		return Route{Method: strings.ToUpper(*method), Path: *p, TokenHeader: NoAuthorizer}, nil
	}
	if authz != "" {
		h, ok := auth.headers[authz]
		if !ok {
			return Route{}, fmt.Errorf("%s event %s: authorizer %q is not declared on the HTTP API", id, evName, authz)
		}
		header = h
	}
	return Route{Method: strings.ToUpper(*method), Path: *p, TokenHeader: header}, nil
}

// NoAuthorizer is SAM's Auth.Authorizer of a route that has none, and
// that route's Route.TokenHeader.
const NoAuthorizer = "NONE"

// authorizers reads the HTTP APIs' authorizers: name -> the header of its
// identity source ("$request.header.X-API-Key" -> "X-API-Key"), and the
// default authorizer's name ("" when none).
func authorizers(tpl *cloudformation.Template) (map[string]string, string, error) {
	headers := map[string]string{}
	def := ""
	for id, api := range tpl.GetAllServerlessHttpApiResources() {
		if api.Auth == nil {
			continue
		}
		if api.Auth.DefaultAuthorizer != nil {
			def = *api.Auth.DefaultAuthorizer
		}
		all, _ := api.Auth.Authorizers.(map[string]any)
		for name, a := range all {
			src, _ := a.(map[string]any)["IdentitySource"].(string)
			h, ok := strings.CutPrefix(src, "$request.header.")
			if !ok || h == "" {
				return nil, "", fmt.Errorf("%s authorizer %s: IdentitySource %q is not a request header", id, name, src)
			}
			headers[name] = h
		}
	}
	return headers, def, nil
}

func functionName(id string, fn *serverless.Function) (string, error) {
	if fn.CodeUri == nil || fn.CodeUri.String == nil || *fn.CodeUri.String == "" {
		return "", fmt.Errorf("function %s: CodeUri must be a local directory", id)
	}
	name := path.Base(strings.TrimRight(*fn.CodeUri.String, "/"))
	if name == "" || name == "." || name == "/" {
		return "", fmt.Errorf("function %s: cannot name it from CodeUri %q", id, *fn.CodeUri.String)
	}
	return name, nil
}

// ParseRate parses an EventBridge rate expression: rate(1 minute),
// rate(5 minutes), rate(2 hours), rate(1 day).
func ParseRate(expr string) (time.Duration, error) {
	inner, ok := strings.CutPrefix(strings.TrimSpace(expr), "rate(")
	if !ok || !strings.HasSuffix(inner, ")") {
		return 0, fmt.Errorf("schedule %q: only rate(...) expressions are supported locally", expr)
	}
	fields := strings.Fields(strings.TrimSuffix(inner, ")"))
	if len(fields) != 2 {
		return 0, fmt.Errorf("schedule %q: want rate(<n> <unit>)", expr)
	}
	n, err := strconv.Atoi(fields[0])
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("schedule %q: the value must be a positive integer", expr)
	}
	units := map[string]time.Duration{
		"minute": time.Minute, "minutes": time.Minute,
		"hour": time.Hour, "hours": time.Hour,
		"day": 24 * time.Hour, "days": 24 * time.Hour,
	}
	u, ok := units[fields[1]]
	if !ok {
		return 0, fmt.Errorf("schedule %q: unit must be minute(s), hour(s) or day(s)", expr)
	}
	if (n == 1) != !strings.HasSuffix(fields[1], "s") {
		return 0, errors.New("schedule " + strconv.Quote(expr) + ": use the singular unit for 1 and the plural otherwise")
	}
	return time.Duration(n) * u, nil
}

// match finds the route for method and path: exact literal segments win
// over {param} segments, a {name+} segment matches the rest of the path.
// It returns the route, its decoded path parameters, and whether the path
// matched some route under another method (405 vs 404).
func (a App) match(method, rawPath string) (Route, map[string]string, bool) {
	segs := strings.Split(strings.Trim(rawPath, "/"), "/")
	best, bestScore := -1, -1
	var bestParams map[string]string
	pathSeen := false
	for i, r := range a.Routes {
		params, score, ok := matchPath(r.Path, segs)
		if !ok {
			continue
		}
		pathSeen = true
		if r.Method != method && r.Method != "ANY" {
			continue
		}
		if r.Method != "ANY" {
			score++ // a method match is more specific than ANY
		}
		if score > bestScore {
			best, bestScore, bestParams = i, score, params
		}
	}
	if best < 0 {
		return Route{}, nil, pathSeen
	}
	return a.Routes[best], bestParams, true
}

func matchPath(tpl string, segs []string) (map[string]string, int, bool) {
	tsegs := strings.Split(strings.Trim(tpl, "/"), "/")
	params := map[string]string{}
	score := 0
	for i, ts := range tsegs {
		if strings.HasPrefix(ts, "{") && strings.HasSuffix(ts, "+}") {
			if i >= len(segs) {
				return nil, 0, false
			}
			params[strings.TrimSuffix(strings.TrimPrefix(ts, "{"), "+}")] = unescapePath(strings.Join(segs[i:], "/"))
			return params, score, true
		}
		if i >= len(segs) {
			return nil, 0, false
		}
		if strings.HasPrefix(ts, "{") && strings.HasSuffix(ts, "}") {
			if segs[i] == "" {
				return nil, 0, false
			}
			params[strings.TrimSuffix(strings.TrimPrefix(ts, "{"), "}")] = unescapePath(segs[i])
			continue
		}
		if ts != segs[i] {
			return nil, 0, false
		}
		score += 2
	}
	if len(tsegs) != len(segs) {
		return nil, 0, false
	}
	return params, score, true
}
