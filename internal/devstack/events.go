package devstack

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/standin"
)

// EventsFile is the file under the run directory where the stack records
// the lifecycle events the functions publish: one JSON object per line,
// the event as EventBridge delivers it to a rule's target (detail-type
// sandbox.<kind>, source sandbox-broker, the event's fields in detail).
const EventsFile = "events.jsonl"

// EventsInfo addresses the local EventBridge stand-in and its record.
type EventsInfo struct {
	// Endpoint is the functions' AWS_ENDPOINT_URL_EVENTBRIDGE.
	Endpoint string `json:"endpoint"`
	// File is the events file (EventsFile under the run directory),
	// emptied at each start.
	File string `json:"file"`
}

// startEvents serves the EventBridge stand-in (standin.EventBus) on a
// loopback port, recording into runDir/EventsFile.
func (s *Stack) startEvents(runDir string) error {
	file := filepath.Join(runDir, EventsFile)
	f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("events file: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Close()
		return fmt.Errorf("event bus: %w", err)
	}
	s.events = &http.Server{Handler: standin.NewEventBus(f), ReadHeaderTimeout: 10 * time.Second}
	s.eventsFile = f
	s.Info.Events = EventsInfo{Endpoint: "http://" + ln.Addr().String(), File: file}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.events.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.fail(fmt.Errorf("event bus: %w", err))
		}
	}()
	return nil
}

// closeEvents stops the stand-in once the functions are stopped.
func (s *Stack) closeEvents() error {
	if s.events == nil {
		return nil
	}
	_ = s.events.Close()
	return s.eventsFile.Close()
}
