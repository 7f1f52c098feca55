package sandboxhost

import (
	"errors"
	"os"
	"sync"
	"time"
)

// A process's output goes to every client attached to it: the Start
// stream that started it and any Process/Connect stream, as E2B's envd
// forks it. Each attached client gets every chunk in order; a slow one
// slows the process's writes, as with one client. A client that leaves
// stops receiving at once.

// outputSink forwards output chunks to its subscribers until closed.
type outputSink struct {
	sendMu sync.Mutex // serialises deliveries, so chunks keep their order
	mu     sync.Mutex
	closed bool
	subs   map[*subscriber]struct{}
}

// subscriber is one client's view of a process's output.
type subscriber struct {
	events chan event // closed when the output ended
	gone   chan struct{}
	once   sync.Once
	sink   *outputSink
}

// subscribe attaches a new client; nil once the output ended.
func (o *outputSink) subscribe() *subscriber {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil
	}
	if o.subs == nil {
		o.subs = map[*subscriber]struct{}{}
	}
	s := &subscriber{events: make(chan event, outputQueue), gone: make(chan struct{}), sink: o}
	o.subs[s] = struct{}{}
	return s
}

// leave detaches the client; a delivery blocked on it goes on without it.
func (s *subscriber) leave() {
	s.once.Do(func() { close(s.gone) })
	s.sink.mu.Lock()
	delete(s.sink.subs, s)
	s.sink.mu.Unlock()
}

// send delivers ev to every attached client.
func (o *outputSink) send(ev event) {
	o.sendMu.Lock()
	defer o.sendMu.Unlock()
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return
	}
	subs := make([]*subscriber, 0, len(o.subs))
	for s := range o.subs {
		subs = append(subs, s)
	}
	o.mu.Unlock()
	for _, s := range subs {
		select {
		case s.events <- ev:
		case <-s.gone:
		}
	}
}

// close ends the output: every client's events channel is closed.
func (o *outputSink) close() {
	o.sendMu.Lock()
	defer o.sendMu.Unlock()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	o.closed = true
	for s := range o.subs {
		close(s.events)
	}
}

// pump reads rd until EOF, forwarding each chunk, and closes rd.
func (o *outputSink) pump(wg *sync.WaitGroup, rd *os.File, isErr bool) {
	defer wg.Done()
	defer rd.Close()
	for {
		buf := make([]byte, outputChunk)
		n, err := rd.Read(buf)
		if n > 0 {
			ev := event{stdout: buf[:n]}
			if isErr {
				ev = event{stderr: buf[:n]}
			}
			o.send(ev)
		}
		if err != nil {
			return
		}
	}
}

// stdinWriteTimeout bounds one SendInput: a process that reads no input
// must not hold a request forever.
const stdinWriteTimeout = 10 * time.Second

// errNoStdin: the process was started without stdin, or it was closed.
var errNoStdin = errors.New("the process's stdin is not open (start it with stdin enabled)")

// writeStdin writes b to the process's stdin.
func (p *process) writeStdin(b []byte) error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return errNoStdin
	}
	if err := p.stdin.SetWriteDeadline(time.Now().Add(stdinWriteTimeout)); err != nil {
		return err
	}
	_, err := p.stdin.Write(b)
	return err
}

// closeStdin closes the process's stdin (the process reads EOF); closing
// it again is no error.
func (p *process) closeStdin() {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin != nil {
		_ = p.stdin.Close()
		p.stdin = nil
	}
}
