package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// EnvReconcileURL is the reconcile function's invoke URL (a Lambda
// Runtime Interface Emulator endpoint, as `make run` starts one per
// function); without it `sbx reconcile` reads the stack file's
// functions.reconcile.
const EnvReconcileURL = "SBX_RECONCILE_URL"

// reconcileTimeout bounds one on-demand pass (the function's own timeout
// in template.yaml is 120 s).
const reconcileTimeout = 150 * time.Second

func (a *App) reconcileCmd(g *globals) *cobra.Command {
	var url string
	cmd := &cobra.Command{
		Use:   "reconcile",
		Short: "Run a reconcile pass now and show its stats",
		Long: `reconcile invokes the reconcile function once, as its schedule would, and prints
the pass's stats. It reaches the function's invoke URL: --url, else $` + EnvReconcileURL + `, else
functions.reconcile of the stack file (` + "`make run`" + `). In AWS, invoke the deployed function
instead: aws lambda invoke --function-name <ReconcileFunction> out.json.`,
		Args: exactArgs(0, "no arguments"),
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			if url == "" {
				url = a.Getenv(EnvReconcileURL)
			}
			if url == "" {
				cfg, err := a.config(g, false)
				if err != nil {
					return err
				}
				if url, err = stackFunctionURL(cfg.Stack, "reconcile"); err != nil {
					return err
				}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), reconcileTimeout)
			defer cancel()
			st, raw, err := a.invokeReconcile(ctx, url)
			if err != nil {
				return err
			}
			if g.json {
				_, err := fmt.Fprintf(a.Stdout, "%s\n", compactJSON(raw))
				return err
			}
			more := "inventory walk complete"
			if !st.InventoryComplete {
				more = "inventory walk continues next pass"
			}
			if st.BudgetExhausted {
				more += " (budget exhausted)"
			}
			fmt.Fprintf(a.Stdout, "reconciled in %s: %d discovered in %d pages, %d adopted, %d duplicates, %d orphans, %d deferred, %d killed, %d dead, %d expired, %d paused, %d paused expired, %d pauses finished, %d releases taken over, %d tombstones retried, %d reservations settled, ledger %+d, %d errors; %s\n",
				st.Duration.Round(time.Millisecond), st.Discovered, st.Pages, st.Adopted, st.Duplicates, st.Orphans,
				st.Deferred, st.Killed, st.Dead, st.Expired, st.Paused, st.PausedExpired, st.PausesFinished, st.ReleasesTakenOver, st.TombstonesRetried, st.ReservationsSettled, st.LedgerRepaired, st.Errors, more)
			return nil
		}),
	}
	cmd.Flags().StringVar(&url, "url", "", "invoke URL of the reconcile function (env "+EnvReconcileURL+")")
	return cmd
}

// stackFunctionURL reads functions.<name> from the stack file.
func stackFunctionURL(st *Stack, name string) (string, error) {
	if st == nil {
		return "", errors.New("no reconcile function: pass --url, set " + EnvReconcileURL + ", or start the local stack with `make run` (it writes " + StackFile + ")")
	}
	raw, err := os.ReadFile(st.Path)
	if err != nil {
		return "", fmt.Errorf("read stack file: %w", err)
	}
	var w struct {
		Functions map[string]string `json:"functions"`
	}
	if err := json.Unmarshal(raw, &w); err != nil {
		return "", fmt.Errorf("stack file %s: %w", st.Path, err)
	}
	if w.Functions[name] == "" {
		return "", fmt.Errorf("stack file %s lists no %q function", st.Path, name)
	}
	return w.Functions[name], nil
}

// invokeReconcile posts an EventBridge scheduled event to the function's
// invoke URL and decodes the stats it returns (the function replies with
// core.ReconcileStats as JSON; internal/wiring.ReconcileHandler). A function error (the
// emulator answers 200 with errorMessage) is an error.
func (a *App) invokeReconcile(ctx context.Context, url string) (core.ReconcileStats, []byte, error) {
	ev, _ := json.Marshal(map[string]any{
		"version": "0", "id": fmt.Sprintf("sbx-%d", time.Now().UnixNano()), "detail-type": "Scheduled Event",
		"source": "aws.events", "time": time.Now().UTC().Format(time.RFC3339), "region": "us-east-1",
		"resources": []string{}, "detail": map[string]any{},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(ev))
	if err != nil {
		return core.ReconcileStats{}, nil, fmt.Errorf("reconcile: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.HTTPClient.Do(req)
	if err != nil {
		return core.ReconcileStats{}, nil, fmt.Errorf("invoke reconcile: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return core.ReconcileStats{}, nil, fmt.Errorf("invoke reconcile: %w", err)
	}
	var fnErr struct {
		ErrorMessage string `json:"errorMessage"`
		ErrorType    string `json:"errorType"`
	}
	_ = json.Unmarshal(raw, &fnErr)
	if resp.StatusCode != http.StatusOK || fnErr.ErrorMessage != "" {
		msg := fnErr.ErrorMessage
		if msg == "" {
			msg = string(bytes.TrimSpace(raw))
		}
		return core.ReconcileStats{}, raw, fmt.Errorf("reconcile function failed (HTTP %d): %s", resp.StatusCode, msg)
	}
	var st core.ReconcileStats
	if err := json.Unmarshal(raw, &st); err != nil {
		return core.ReconcileStats{}, raw, fmt.Errorf("reconcile reply: %w", err)
	}
	return st, raw, nil
}
