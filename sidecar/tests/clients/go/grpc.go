package main

// The gRPC scenario: the same client library over its gRPC transport
// (storage.NewGRPCClient, google.storage.v2.Storage) against a plaintext
// HTTP/2 endpoint.
//
// Usage: BUCKETMAP_TEST_GRPC_ENDPOINT=127.0.0.1:PORT scenario --grpc SPEC.json
//
// SPEC.json: {"buckets": {"photos": ID}, "small_file": PATH, "large_file":
// PATH, "range": {"start": N, "length": N}, "list_prefix": P, "objects":
// {"small": NAME, "large": NAME, "missing": NAME}}. The small object is
// written in one stream (ChunkSize 0), the large one with the library's
// default resumable upload; reads use ReadObject (the library's default)
// and, in the bidi_read_range step, BidiReadObject (WithGRPCBidiReads).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// grpcEndpoint is host:port of BUCKETMAP_TEST_GRPC_ENDPOINT (a scheme is
// dropped: gRPC endpoints have none).
func grpcEndpoint() (string, error) {
	endpoint := os.Getenv("BUCKETMAP_TEST_GRPC_ENDPOINT")
	if endpoint == "" {
		return "", errors.New("BUCKETMAP_TEST_GRPC_ENDPOINT (127.0.0.1:PORT) is required with --grpc")
	}
	endpoint = strings.TrimPrefix(endpoint, "http://")
	return strings.TrimSuffix(endpoint, "/"), nil
}

// newGRPCClient connects without TLS and without credentials, and without
// the client metrics exporter (it would call Cloud Monitoring).
func newGRPCClient(ctx context.Context, endpoint string, extra ...option.ClientOption) (*storage.Client, error) {
	opts := []option.ClientOption{
		option.WithEndpoint(endpoint),
		option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
		storage.WithDisabledClientMetrics(),
	}
	return storage.NewGRPCClient(ctx, append(opts, extra...)...)
}

// grpcErrorOf adds the gRPC status code to errorOf's fields.
func grpcErrorOf(err error) result {
	out := errorOf(err)
	if st, ok := status.FromError(err); ok {
		out["grpc_code"] = st.Code().String()
	} else {
		var wrapped interface{ GRPCStatus() *status.Status }
		if errors.As(err, &wrapped) {
			out["grpc_code"] = wrapped.GRPCStatus().Code().String()
		}
	}
	return out
}

type grpcScenario struct {
	spec   spec
	photos *storage.BucketHandle
	bidi   *storage.BucketHandle
	steps  map[string]result
}

func (s *grpcScenario) step(ctx context.Context, name string, fn func(context.Context) (result, error)) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := fn(ctx)
	if out == nil {
		out = result{}
	}
	if err != nil {
		out["ok"] = false
		out["error"] = grpcErrorOf(err)
	} else {
		out["ok"] = true
	}
	s.steps[name] = out
}

func writeFile(ctx context.Context, obj *storage.ObjectHandle, path string, chunkSize int) (result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	w := obj.NewWriter(ctx)
	w.ChunkSize = chunkSize
	w.ContentType = "application/octet-stream"
	w.Metadata = map[string]string{"scenario": "grpc"}
	if _, err := io.Copy(w, f); err != nil {
		w.Close()
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return result{"resource": resource(w.Attrs())}, nil
}

func readDigest(ctx context.Context, obj *storage.ObjectHandle, offset, length int64) (result, error) {
	data, err := readAll(ctx, obj, offset, length)
	if err != nil {
		return nil, err
	}
	return result{"data": digest(data)}, nil
}

func (s *grpcScenario) run(ctx context.Context) {
	o := s.spec.Objects
	small, large := s.photos.Object(o["small"]), s.photos.Object(o["large"])
	r := s.spec.Range

	s.step(ctx, "write_small", func(ctx context.Context) (result, error) {
		return writeFile(ctx, small, s.spec.SmallFile, 0)
	})
	s.step(ctx, "write_large", func(ctx context.Context) (result, error) {
		return writeFile(ctx, large, s.spec.LargeFile, googleDefaultChunkSize)
	})
	s.step(ctx, "read_full", func(ctx context.Context) (result, error) {
		return readDigest(ctx, large, 0, -1)
	})
	s.step(ctx, "read_small", func(ctx context.Context) (result, error) {
		return readDigest(ctx, small, 0, -1)
	})
	s.step(ctx, "read_range", func(ctx context.Context) (result, error) {
		return readDigest(ctx, large, r.Start, r.Length)
	})
	s.step(ctx, "bidi_read_range", func(ctx context.Context) (result, error) {
		return readDigest(ctx, s.bidi.Object(o["large"]), r.Start, r.Length)
	})
	s.step(ctx, "list", func(ctx context.Context) (result, error) {
		it := s.photos.Objects(ctx, &storage.Query{Prefix: s.spec.ListPrefix})
		names := []string{}
		for {
			a, err := it.Next()
			if errors.Is(err, iterator.Done) {
				break
			}
			if err != nil {
				return nil, err
			}
			names = append(names, a.Name)
		}
		sort.Strings(names)
		return result{"names": names}, nil
	})
	s.step(ctx, "attrs", func(ctx context.Context) (result, error) {
		a, err := large.Attrs(ctx)
		if err != nil {
			return nil, err
		}
		out := result{"resource": resource(a), "crc32c": fmt.Sprint(a.CRC32C)}
		return out, nil
	})
	s.step(ctx, "delete", func(ctx context.Context) (result, error) {
		return deleteAndCheck(ctx, small)
	})
	s.step(ctx, "not_found", func(ctx context.Context) (result, error) {
		return notFound(ctx, s.photos.Object(o["missing"]), grpcErrorOf), nil
	})
}

// googleDefaultChunkSize is the Writer's default ChunkSize (16 MiB): a
// resumable upload flushed at every chunk.
const googleDefaultChunkSize = 16 * 1024 * 1024

func runGRPC(ctx context.Context, sp spec) (result, error) {
	endpoint, err := grpcEndpoint()
	if err != nil {
		return nil, err
	}
	client, err := newGRPCClient(ctx, endpoint)
	if err != nil {
		return nil, fmt.Errorf("storage.NewGRPCClient: %w", err)
	}
	defer client.Close()
	bidi, err := newGRPCClient(ctx, endpoint, storage.WithGRPCBidiReads())
	if err != nil {
		return nil, fmt.Errorf("storage.NewGRPCClient(WithGRPCBidiReads): %w", err)
	}
	defer bidi.Close()
	s := &grpcScenario{
		spec:   sp,
		photos: client.Bucket(sp.Buckets["photos"]),
		bidi:   bidi.Bucket(sp.Buckets["photos"]),
		steps:  map[string]result{},
	}
	s.run(ctx)
	return result{
		"client":   "go",
		"library":  libraryVersion(),
		"api":      "grpc",
		"endpoint": endpoint,
		"steps":    s.steps,
	}, nil
}
