// Command photo-app is the example application of the node tests: an
// unmodified program using the official Go client (cloud.google.com/go/storage)
// that knows only the logical bucket name "photos" and reaches Cloud Storage
// through the bucketmap sidecar, which the injection sets in
// STORAGE_EMULATOR_HOST.
//
// It writes hello.txt, reads it back and checks the content, then asks for
// hello.txt's metadata every 200 ms, logging each failure. On SIGTERM (or
// SIGINT) it drains as a real application does: for two more seconds it
// keeps asking (an app flushing its last writes), then logs
// "requests=N failures=M drained=K" and exits 0. The node tests read that
// line: a sidecar that stopped before the app would fail the drained
// requests.
//
// It writes nothing to its own filesystem (readOnlyRootFilesystem) and needs
// no privileges.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"cloud.google.com/go/storage"
)

const (
	bucket   = "photos"
	object   = "hello.txt"
	content  = "hello from photo-app\n"
	interval = 200 * time.Millisecond
	timeout  = 5 * time.Second
	drain    = 2 * time.Second
)

func main() {
	log.SetOutput(os.Stdout)
	log.SetFlags(log.LstdFlags | log.Lmicroseconds | log.LUTC)
	if os.Getenv("STORAGE_EMULATOR_HOST") == "" {
		log.Fatal("STORAGE_EMULATOR_HOST is not set: photo-app reaches bucket photos only through the bucketmap sidecar")
	}
	stop, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()

	client, err := storage.NewClient(context.Background())
	if err != nil {
		log.Fatalf("cannot create the storage client: %v", err)
	}
	defer client.Close()
	// No retries inside the client: every failure is seen and counted here.
	obj := client.Bucket(bucket).Object(object).Retryer(storage.WithPolicy(storage.RetryNever))

	if !writeUntilDone(stop, obj) {
		log.Printf("stopped before hello.txt was written")
		log.Printf("requests=0 failures=0 drained=0")
		return
	}
	requests, failures := pollMetadata(stop, obj)
	deadline, cancelDrain := context.WithTimeout(context.Background(), drain)
	defer cancelDrain()
	drained, drainFailures := pollMetadata(deadline, obj)
	log.Printf("requests=%d failures=%d drained=%d",
		requests+drained, failures+drainFailures, drained)
}

// writeUntilDone writes and checks hello.txt, retrying every second (the
// bucket may not be mapped yet) until it succeeds or stop is done.
func writeUntilDone(stop context.Context, obj *storage.ObjectHandle) bool {
	for {
		err := writeAndCheck(obj)
		if err == nil {
			log.Printf("wrote %s to %s and read it back", object, bucket)
			return true
		}
		log.Printf("cannot write %s to %s yet: %v", object, bucket, err)
		select {
		case <-stop.Done():
			return false
		case <-time.After(time.Second):
		}
	}
}

func writeAndCheck(obj *storage.ObjectHandle) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	w := obj.NewWriter(ctx)
	w.ContentType = "text/plain"
	if _, err := io.WriteString(w, content); err != nil {
		_ = w.Close()
		return fmt.Errorf("write: %w", err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	r, err := obj.NewReader(ctx)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	defer r.Close()
	got, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if string(got) != content {
		return fmt.Errorf("read back %q, wrote %q", got, content)
	}
	return nil
}

// pollMetadata asks for the object's metadata every interval until stop is
// done; a request in flight when stop comes is finished, not cancelled.
func pollMetadata(stop context.Context, obj *storage.ObjectHandle) (requests, failures int) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		requests++
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		_, err := obj.Attrs(ctx)
		cancel()
		if err != nil {
			failures++
			log.Printf("request %d failed: %v", requests, err)
		}
		select {
		case <-stop.Done():
			return requests, failures
		case <-ticker.C:
		}
	}
}
