// Command scenario drives the sidecar with the real Go client
// (cloud.google.com/go/storage).
//
// Usage: STORAGE_EMULATOR_HOST=127.0.0.1:PORT scenario SPEC.json
//
//	BUCKETMAP_TEST_GRPC_ENDPOINT=127.0.0.1:PORT scenario --grpc SPEC.json
//
// (the gRPC scenario: grpc.go).
//
// SPEC.json is written by the Rust integration test (sidecar/tests/integration/common):
// the logical bucket names, the files to upload and every object name. This
// program only observes: it runs each step, records what the library returned
// (object attributes under their JSON API field names, digests of downloaded
// bytes, errors), and prints one JSON report on stdout. The Rust test decides
// what is right. A failing step is recorded and the scenario goes on.
//
// Reads go through the XML API (GET /BUCKET/OBJECT), the library's default;
// one extra step reads through the JSON API (storage.WithJSONReads).
package main

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
)

type spec struct {
	Buckets    map[string]string `json:"buckets"`
	SmallFile  string            `json:"small_file"`
	LargeFile  string            `json:"large_file"`
	ChunkSize  int               `json:"chunk_size"`
	Range      struct{ Start, Length int64 }
	Tree       []struct{ Name, Content string }
	ListPrefix string `json:"list_prefix"`
	Compose    struct {
		Sources     []string
		Destination string
	}
	Metadata map[string]string `json:"metadata"`
	Objects  map[string]string `json:"objects"`
}

type result map[string]any

type scenario struct {
	spec     spec
	client   *storage.Client
	jsonRead *storage.Client
	photos   *storage.BucketHandle
	videos   *storage.BucketHandle
	steps    map[string]result
}

func digest(data []byte) result {
	sum := sha256.Sum256(data)
	return result{"len": len(data), "sha256": hex.EncodeToString(sum[:])}
}

// resource renders object attributes under their JSON API field names.
func resource(a *storage.ObjectAttrs) result {
	if a == nil {
		return nil
	}
	out := result{
		"bucket":      a.Bucket,
		"name":        a.Name,
		"size":        fmt.Sprint(a.Size),
		"md5Hash":     base64.StdEncoding.EncodeToString(a.MD5),
		"metadata":    a.Metadata,
		"contentType": a.ContentType,
		"generation":  fmt.Sprint(a.Generation),
	}
	if a.MediaLink != "" { // absent from some responses (e.g. fake-gcs-server's PATCH)
		out["mediaLink"] = a.MediaLink
	}
	return out
}

func errorOf(err error) result {
	out := result{"type": fmt.Sprintf("%T", err), "message": err.Error()}
	var apiErr *googleapi.Error
	if errors.As(err, &apiErr) {
		out["code"] = apiErr.Code
	}
	if errors.Is(err, storage.ErrObjectNotExist) {
		out["code"] = 404
		out["object_not_exist"] = true
	}
	if errors.Is(err, storage.ErrBucketNotExist) {
		out["code"] = 404
		out["bucket_not_exist"] = true
	}
	return out
}

func (s *scenario) step(ctx context.Context, name string, fn func(context.Context) (result, error)) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := fn(ctx)
	if out == nil {
		out = result{}
	}
	if err != nil {
		out["ok"] = false
		out["error"] = errorOf(err)
	} else {
		out["ok"] = true
	}
	s.steps[name] = out
}

func (s *scenario) upload(ctx context.Context, obj *storage.ObjectHandle, chunkSize int, contentType string, src io.Reader) (*storage.ObjectAttrs, error) {
	w := obj.NewWriter(ctx)
	w.ChunkSize = chunkSize // 0: one multipart request; > 0: resumable upload in chunks of that size
	w.ContentType = contentType
	if _, err := io.Copy(w, src); err != nil {
		w.Close()
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return w.Attrs(), nil
}

func uploadFile(ctx context.Context, s *scenario, obj *storage.ObjectHandle, path string, chunkSize int, contentType string) (*storage.ObjectAttrs, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return s.upload(ctx, obj, chunkSize, contentType, f)
}

func readAll(ctx context.Context, obj *storage.ObjectHandle, offset, length int64) ([]byte, error) {
	r, err := obj.NewRangeReader(ctx, offset, length)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

func (s *scenario) run(ctx context.Context) {
	o := s.spec.Objects

	s.step(ctx, "get_bucket", func(ctx context.Context) (result, error) {
		attrs, err := s.photos.Attrs(ctx)
		if err != nil {
			return nil, err
		}
		return result{"resource": result{"name": attrs.Name}}, nil
	})

	s.step(ctx, "small_upload", func(ctx context.Context) (result, error) {
		attrs, err := uploadFile(ctx, s, s.photos.Object(o["small"]), s.spec.SmallFile, 0, "text/plain")
		return result{"resource": resource(attrs)}, err
	})

	s.step(ctx, "large_upload", func(ctx context.Context) (result, error) {
		attrs, err := uploadFile(ctx, s, s.photos.Object(o["large"]), s.spec.LargeFile, s.spec.ChunkSize, "application/octet-stream")
		return result{"resource": resource(attrs)}, err
	})

	s.step(ctx, "tree_upload", func(ctx context.Context) (result, error) {
		var out []result
		for _, t := range s.spec.Tree {
			attrs, err := s.upload(ctx, s.photos.Object(t.Name), 0, "text/plain", strings.NewReader(t.Content))
			if err != nil {
				return result{"resources": out}, err
			}
			out = append(out, resource(attrs))
		}
		return result{"resources": out}, nil
	})

	s.step(ctx, "download_full", func(ctx context.Context) (result, error) {
		large, err := readAll(ctx, s.photos.Object(o["large"]), 0, -1)
		if err != nil {
			return nil, err
		}
		small, err := readAll(ctx, s.photos.Object(o["small"]), 0, -1)
		if err != nil {
			return nil, err
		}
		return result{"large": digest(large), "small": digest(small)}, nil
	})

	s.step(ctx, "download_full_json_api", func(ctx context.Context) (result, error) {
		large, err := readAll(ctx, s.jsonRead.Bucket(s.spec.Buckets["photos"]).Object(o["large"]), 0, -1)
		if err != nil {
			return nil, err
		}
		return result{"large": digest(large)}, nil
	})

	s.step(ctx, "download_range", func(ctx context.Context) (result, error) {
		data, err := readAll(ctx, s.photos.Object(o["large"]), s.spec.Range.Start, s.spec.Range.Length)
		if err != nil {
			return nil, err
		}
		return result{"range": digest(data)}, nil
	})

	list := func(ctx context.Context, q *storage.Query) (result, error) {
		items := []result{}
		prefixes := []string{}
		it := s.photos.Objects(ctx, q)
		for {
			attrs, err := it.Next()
			if err == iterator.Done {
				break
			}
			if err != nil {
				return result{"items": items, "prefixes": prefixes}, err
			}
			if attrs.Prefix != "" {
				prefixes = append(prefixes, attrs.Prefix)
			} else {
				items = append(items, resource(attrs))
			}
		}
		sort.Strings(prefixes)
		return result{"items": items, "prefixes": prefixes}, nil
	}
	s.step(ctx, "list_delimited", func(ctx context.Context) (result, error) {
		return list(ctx, &storage.Query{Prefix: s.spec.ListPrefix, Delimiter: "/"})
	})
	s.step(ctx, "list_prefix", func(ctx context.Context) (result, error) {
		out, err := list(ctx, &storage.Query{Prefix: s.spec.ListPrefix})
		delete(out, "prefixes")
		return out, err
	})

	// The Go library copies with rewriteTo only (no copyTo).
	copyStep := func(src, dst string) func(context.Context) (result, error) {
		return func(ctx context.Context) (result, error) {
			calls := 0
			c := s.videos.Object(dst).CopierFrom(s.photos.Object(src))
			c.ProgressFunc = func(_, _ uint64) { calls++ }
			attrs, err := c.Run(ctx)
			if err != nil {
				return nil, err
			}
			data, err := readAll(ctx, s.videos.Object(dst), 0, -1)
			if err != nil {
				return result{"resource": resource(attrs)}, err
			}
			return result{"resource": resource(attrs), "calls": calls, "content": digest(data)}, nil
		}
	}
	s.step(ctx, "copy", copyStep(o["small"], o["copy"]))
	s.step(ctx, "rewrite", copyStep(o["large"], o["rewrite"]))

	s.step(ctx, "compose", func(ctx context.Context) (result, error) {
		var srcs []*storage.ObjectHandle
		for _, name := range s.spec.Compose.Sources {
			srcs = append(srcs, s.photos.Object(name))
		}
		c := s.photos.Object(s.spec.Compose.Destination).ComposerFrom(srcs...)
		c.ContentType = "text/plain"
		attrs, err := c.Run(ctx)
		if err != nil {
			return nil, err
		}
		data, err := readAll(ctx, s.photos.Object(s.spec.Compose.Destination), 0, -1)
		if err != nil {
			return result{"resource": resource(attrs)}, err
		}
		return result{"resource": resource(attrs), "content": digest(data)}, nil
	})

	s.step(ctx, "metadata_patch", func(ctx context.Context) (result, error) {
		obj := s.photos.Object(o["small"])
		attrs, err := obj.Update(ctx, storage.ObjectAttrsToUpdate{Metadata: s.spec.Metadata})
		if err != nil {
			return nil, err
		}
		reloaded, err := obj.Attrs(ctx)
		return result{"resource": resource(attrs), "reloaded": resource(reloaded)}, err
	})

	s.step(ctx, "delete", func(ctx context.Context) (result, error) {
		return deleteAndCheck(ctx, s.photos.Object(s.spec.Compose.Destination))
	})

	s.step(ctx, "not_found", func(ctx context.Context) (result, error) {
		// Over HTTP, the read goes the XML API's path.
		return notFound(ctx, s.photos.Object(o["missing"]), errorOf), nil
	})
}

// deleteAndCheck deletes obj and reports whether it still exists after.
func deleteAndCheck(ctx context.Context, obj *storage.ObjectHandle) (result, error) {
	if err := obj.Delete(ctx); err != nil {
		return nil, err
	}
	_, err := obj.Attrs(ctx)
	switch {
	case errors.Is(err, storage.ErrObjectNotExist):
		return result{"exists_after": false}, nil
	case err == nil:
		return result{"exists_after": true}, nil
	default:
		return nil, err
	}
}

// notFound reports the errors of reading the attributes and the content
// of the missing object obj, described by describe.
func notFound(ctx context.Context, obj *storage.ObjectHandle, describe func(error) result) result {
	out := result{"error": nil, "read_error": nil}
	if _, err := obj.Attrs(ctx); err != nil {
		out["error"] = describe(err)
	}
	if _, err := readAll(ctx, obj, 0, -1); err != nil {
		out["read_error"] = describe(err)
	}
	return out
}

func libraryVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "cloud.google.com/go/storage" {
				return dep.Path + " " + dep.Version
			}
		}
	}
	return "cloud.google.com/go/storage (unknown version)"
}

func main() {
	args := os.Args[1:]
	grpcMode := len(args) == 2 && args[0] == "--grpc"
	if grpcMode {
		args = args[1:]
	}
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: scenario [--grpc] SPEC.json")
		os.Exit(2)
	}
	raw, err := os.ReadFile(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var sp spec
	if err := json.Unmarshal(raw, &sp); err != nil {
		fmt.Fprintln(os.Stderr, "bad spec:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	if grpcMode {
		report, err := runGRPC(ctx, sp)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		printReport(report)
		return
	}
	client, err := storage.NewClient(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "storage.NewClient:", err)
		os.Exit(1)
	}
	defer client.Close()
	jsonRead, err := storage.NewClient(ctx, storage.WithJSONReads())
	if err != nil {
		fmt.Fprintln(os.Stderr, "storage.NewClient(WithJSONReads):", err)
		os.Exit(1)
	}
	defer jsonRead.Close()

	s := &scenario{
		spec:     sp,
		client:   client,
		jsonRead: jsonRead,
		photos:   client.Bucket(sp.Buckets["photos"]),
		videos:   client.Bucket(sp.Buckets["videos"]),
		steps:    map[string]result{},
	}
	s.run(ctx)

	report := result{
		"client":        "go",
		"library":       libraryVersion(),
		"emulator_host": os.Getenv("STORAGE_EMULATOR_HOST"),
		"steps":         s.steps,
	}
	printReport(report)
}

func printReport(report result) {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", " ")
	if err := enc.Encode(report); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
