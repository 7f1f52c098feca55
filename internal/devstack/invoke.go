package devstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// The Lambda Invoke API, locally. The emulator serves only its own
// function's synchronous invocations (POST /2015-03-31/functions/function/
// invocations; it ignores X-Amz-Invocation-Type), so a function that
// invokes another asynchronously (a pool claim starting a refill of the
// pool through the reconcile function) reaches this stand-in instead
// (AWS_ENDPOINT_URL_LAMBDA): POST /2015-03-31/functions/<name>/invocations
// with X-Amz-Invocation-Type Event is accepted with 202 at once and run on
// one of the function's emulators in the background, as Lambda queues it;
// RequestResponse (the default) answers the function's reply.

// invokePrefix and invokeSuffix frame the Invoke API path around the
// function name.
const (
	invokePrefix = "/2015-03-31/functions/"
	invokeSuffix = "/invocations"
)

// maxEventPayload is Lambda's payload limit for asynchronous invocations.
const maxEventPayload = 256 << 10

// invokeAPI serves the Lambda Invoke API for the stack's functions.
type invokeAPI struct {
	s   *Stack
	ctx context.Context // the stack's run context: background invocations end with it
}

// listenInvoke binds the Invoke API's loopback listener, so the functions
// can be given its URL before they start; serveInvoke serves it once they
// run.
func (s *Stack) listenInvoke() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("lambda invoke api: %w", err)
	}
	s.invokeLn = ln
	return nil
}

// invokeURL is the Invoke API's base URL ("" before listenInvoke).
func (s *Stack) invokeURL() string {
	if s.invokeLn == nil {
		return ""
	}
	return "http://" + s.invokeLn.Addr().String()
}

// functionURL is the Invoke API URL of function name ("" before
// listenInvoke): what the stack file gives callers from outside the
// stack (sbx reconcile), so that their invocations queue on the
// function's instances as the schedule's and the gateway's do.
func (s *Stack) functionURL(name string) string {
	if base := s.invokeURL(); base != "" {
		return base + invokePrefix + name + invokeSuffix
	}
	return ""
}

// refillFunction is the function a pool claim invokes to refill the pool:
// the scheduled one (the reconcile pass), as in the templates.
func (s *Stack) refillFunction() string {
	for _, f := range s.app.Functions {
		if len(f.Schedules) > 0 {
			return f.Name
		}
	}
	return ""
}

// serveInvoke serves the Invoke API until the stack closes.
func (s *Stack) serveInvoke(runCtx context.Context) {
	srv := &http.Server{Handler: &invokeAPI{s: s, ctx: runCtx}, ReadHeaderTimeout: 10 * time.Second}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		if err := srv.Serve(s.invokeLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.fail(fmt.Errorf("lambda invoke api: %w", err))
		}
	}()
	go func() {
		defer s.wg.Done()
		<-runCtx.Done()
		_ = srv.Close()
	}()
}

// invokeError writes a Lambda-style error reply.
func invokeError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Amzn-ErrorType", typ)
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"Type":"User","message":%q}`, msg)
}

func (a *invokeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name, ok := strings.CutPrefix(r.URL.Path, invokePrefix)
	name, ok2 := strings.CutSuffix(name, invokeSuffix)
	if r.Method != http.MethodPost || !ok || !ok2 || strings.Contains(name, "/") {
		invokeError(w, http.StatusNotFound, "UnknownOperationException", "only Invoke is served here")
		return
	}
	lf := a.s.fns[name]
	if lf == nil {
		invokeError(w, http.StatusNotFound, "ResourceNotFoundException", "Function not found: "+name)
		return
	}
	async := false
	switch t := r.Header.Get("X-Amz-Invocation-Type"); t {
	case "", "RequestResponse":
	case "Event":
		async = true
	default:
		invokeError(w, http.StatusBadRequest, "InvalidParameterValueException", "unsupported invocation type "+t)
		return
	}
	limit := int64(maxInvokeResponse)
	if async {
		limit = maxEventPayload
	}
	payload, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		invokeError(w, http.StatusBadRequest, "InvalidRequestContentException", err.Error())
		return
	}
	if int64(len(payload)) > limit {
		invokeError(w, http.StatusRequestEntityTooLarge, "RequestTooLargeException", "payload too large")
		return
	}
	if async {
		w.WriteHeader(http.StatusAccepted)
		a.s.wg.Add(1)
		go func() {
			defer a.s.wg.Done()
			out, err := lf.invoke(a.ctx, payload)
			if err != nil {
				a.s.log.Error("asynchronous invocation failed", "function", name, "error", err.Error())
				return
			}
			a.s.log.Info("asynchronous invocation", "function", name, "result", truncate(string(out), 500))
		}()
		return
	}
	out, err := lf.invoke(r.Context(), payload)
	var ie *InvokeError
	switch {
	case errors.As(err, &ie) && ie.Status == http.StatusOK:
		// A handler error: Lambda answers 200 with X-Amz-Function-Error.
		w.Header().Set("X-Amz-Function-Error", "Unhandled")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, ie.Body)
	case err != nil:
		invokeError(w, http.StatusBadGateway, "ServiceException", err.Error())
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	}
}
