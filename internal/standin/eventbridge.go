package standin

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
)

// EventBusAccount is the account id of the events EventBus delivers.
const EventBusAccount = "000000000000"

// EventBus is a loopback stand-in for Amazon EventBridge's PutEvents (the
// AWS JSON 1.1 protocol the SDK speaks, target AWSEvents.PutEvents): every
// accepted entry is written to its writer as one JSON line, the event as
// EventBridge delivers it to a rule's target (version, id, detail-type,
// source, account, time, region, resources, detail). It does not check
// signatures. Fail, when set, is asked about each entry: a non-empty
// answer refuses it with that error code (FailedEntryCount), for fault
// injection.
type EventBus struct {
	mu sync.Mutex
	w  io.Writer
	// Fail decides per entry (its detail-type and detail) whether the bus
	// refuses it, answering an error code, or accepts it ("").
	Fail func(detailType, detail string) string
}

// EventBridgeClient is a client of the EventBridge at endpoint (a base
// URL, such as an EventBus's server) in region with static credentials.
func EventBridgeClient(endpoint, region string, timeout time.Duration) *eventbridge.Client {
	return eventbridge.New(eventbridge.Options{
		Region:       region,
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider("standin", "standin", ""),
		HTTPClient:   &http.Client{Timeout: timeout},
	})
}

// NewEventBus returns a bus writing the events it accepts to w.
func NewEventBus(w io.Writer) *EventBus { return &EventBus{w: w} }

// SetFail replaces Fail while requests may be in flight.
func (b *EventBus) SetFail(fail func(detailType, detail string) string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.Fail = fail
}

// putEntry is one PutEvents request entry.
type putEntry struct {
	Source       string
	DetailType   string
	Detail       string
	EventBusName string
	Resources    []string
	Time         *float64 // epoch seconds
}

// Delivered is an event as EventBridge delivers it (and as the bus writes it).
type Delivered struct {
	Version    string          `json:"version"`
	ID         string          `json:"id"`
	DetailType string          `json:"detail-type"`
	Source     string          `json:"source"`
	Account    string          `json:"account"`
	Time       time.Time       `json:"time"`
	Region     string          `json:"region"`
	Resources  []string        `json:"resources"`
	Detail     json.RawMessage `json:"detail"`
}

type resultEntry struct {
	EventID      string `json:"EventId,omitempty"`
	ErrorCode    string `json:"ErrorCode,omitempty"`
	ErrorMessage string `json:"ErrorMessage,omitempty"`
}

// ServeHTTP answers PutEvents.
func (b *EventBus) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if target := r.Header.Get("X-Amz-Target"); target != "AWSEvents.PutEvents" {
		awsError(w, http.StatusBadRequest, "UnknownOperationException", fmt.Sprintf("operation %q is not served by this stand-in", target))
		return
	}
	var in struct{ Entries []putEntry }
	if err := json.NewDecoder(io.LimitReader(r.Body, 2<<20)).Decode(&in); err != nil {
		awsError(w, http.StatusBadRequest, "SerializationException", err.Error())
		return
	}
	if len(in.Entries) == 0 || len(in.Entries) > 10 {
		awsError(w, http.StatusBadRequest, "ValidationException", fmt.Sprintf("%d entries: 1 to 10 are accepted", len(in.Entries)))
		return
	}
	out := struct {
		FailedEntryCount int
		Entries          []resultEntry
	}{Entries: make([]resultEntry, len(in.Entries))}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, e := range in.Entries {
		code, msg := b.check(e)
		if code == "" && b.Fail != nil {
			code, msg = b.Fail(e.DetailType, e.Detail), "refused by the stand-in's fault injection"
		}
		if code != "" {
			out.FailedEntryCount++
			out.Entries[i] = resultEntry{ErrorCode: code, ErrorMessage: msg}
			continue
		}
		d := Delivered{Version: "0", ID: newEventID(), DetailType: e.DetailType, Source: e.Source, Account: EventBusAccount,
			Time: time.Now().UTC().Truncate(time.Second), Region: Region, Resources: e.Resources, Detail: json.RawMessage(e.Detail)}
		if e.Time != nil {
			sec, frac := math.Modf(*e.Time)
			d.Time = time.Unix(int64(sec), int64(frac*1e9)).UTC().Truncate(time.Second)
		}
		if d.Resources == nil {
			d.Resources = []string{}
		}
		line, err := json.Marshal(d)
		if err == nil {
			_, err = b.w.Write(append(line, '\n'))
		}
		if err != nil {
			out.FailedEntryCount++
			out.Entries[i] = resultEntry{ErrorCode: "InternalFailure", ErrorMessage: err.Error()}
			continue
		}
		out.Entries[i] = resultEntry{EventID: d.ID}
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	_ = json.NewEncoder(w).Encode(out)
}

// check refuses an entry EventBridge would refuse: no source or
// detail-type, or a detail that is not a JSON object.
func (b *EventBus) check(e putEntry) (code, msg string) {
	var obj map[string]json.RawMessage
	switch {
	case strings.TrimSpace(e.Source) == "" || strings.TrimSpace(e.DetailType) == "":
		return "InvalidArgument", "source and detail-type are required"
	case json.Unmarshal([]byte(e.Detail), &obj) != nil:
		return "MalformedDetail", "detail is not a JSON object"
	}
	return "", ""
}

// awsError answers an AWS JSON 1.1 error.
func awsError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-ErrorType", code)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": code, "message": msg})
}

func newEventID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
