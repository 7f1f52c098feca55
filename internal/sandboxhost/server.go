package sandboxhost

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Server is a Host listening on loopback: the control plane on APIURL and
// envd on EnvdURL. Create it with Start; stop it with Close.
type Server struct {
	// Host is the running host (for direct inspection in tests).
	Host *Host
	// APIURL is the control-plane base URL, e.g. http://127.0.0.1:40123
	// (use as E2B_API_URL).
	APIURL string
	// EnvdURL is the envd base URL for every sandbox (use as
	// E2B_SANDBOX_URL; route with the E2b-Sandbox-Id header).
	EnvdURL string

	servers []*http.Server
	done    chan struct{}
	once    sync.Once
	err     error
}

// Start creates a Host from opts and serves it on apiAddr and envdAddr
// ("host:port"; an empty host means 127.0.0.1, port 0 or ":0" a free port).
// Both addresses must be loopback. It returns once both listeners are
// bound. Cancelling ctx closes the server (as Close does).
//
// Errors: those of New, a non-loopback address, or a failed listen.
func Start(ctx context.Context, opts Options, apiAddr, envdAddr string) (*Server, error) {
	h, err := New(opts)
	if err != nil {
		return nil, err
	}
	s := &Server{Host: h, done: make(chan struct{})}
	var lns []net.Listener
	for _, addr := range []string{apiAddr, envdAddr} {
		ln, err := listenLoopback(addr)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			_ = h.Close()
			return nil, err
		}
		lns = append(lns, ln)
	}
	s.APIURL = "http://" + lns[0].Addr().String()
	s.EnvdURL = "http://" + lns[1].Addr().String()
	for i, handler := range []http.Handler{h.APIHandler(), h.EnvdHandler()} {
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
		s.servers = append(s.servers, srv)
		go func(ln net.Listener) {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				h.log.Error("sandbox host listener failed", "addr", ln.Addr().String(), "error", err.Error())
			}
		}(lns[i])
	}
	go func() {
		select {
		case <-ctx.Done():
			_ = s.Close()
		case <-s.done:
		}
	}()
	h.log.Info("sandbox host listening", "api_url", s.APIURL, "envd_url", s.EnvdURL, "isolated", h.Isolated())
	return s, nil
}

// listenLoopback listens on addr, refusing anything but loopback.
func listenLoopback(addr string) (net.Listener, error) {
	if addr == "" {
		addr = ":0"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("sandboxhost: address %q: %w", addr, err)
	}
	if host == "" || host == "localhost" {
		host = "127.0.0.1"
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("sandboxhost: address %q is not loopback", addr)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, fmt.Errorf("sandboxhost: listen %s: %w", addr, err)
	}
	return ln, nil
}

// Close stops both listeners (waiting up to 5 s for requests in flight)
// and kills every sandbox. Safe to call more than once.
func (s *Server) Close() error {
	s.once.Do(func() {
		close(s.done)
		// Kill sandboxes first so streaming requests end promptly.
		herr := s.Host.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var errs []error
		for _, srv := range s.servers {
			if err := srv.Shutdown(ctx); err != nil {
				errs = append(errs, err, srv.Close())
			}
		}
		s.err = errors.Join(append(errs, herr)...)
	})
	return s.err
}
