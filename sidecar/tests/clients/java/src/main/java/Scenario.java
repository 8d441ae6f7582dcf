// The Java client scenario: Google's google-cloud-storage (the version
// libraries-bom pins in pom.xml), default settings, so it gzips its request
// bodies (Content-Encoding: gzip) and sends PATCH as a POST with
// X-HTTP-Method-Override.
//
// Usage: java -cp CLASSES:LIB/* Scenario SPEC.json   (BUCKETMAP_TEST_ENDPOINT=http://127.0.0.1:PORT)
//
// SPEC.json is written by the Rust integration test (sidecar/tests/integration/common):
// the logical bucket names, the files to upload and every object name. This
// program only observes: it runs each step, records what the library
// returned (object fields under their JSON API names, digests of downloaded
// bytes, errors) and prints one JSON report on stdout. The Rust test decides
// what is right. A failing step is recorded and the scenario goes on.

import com.google.cloud.NoCredentials;
import com.google.cloud.ReadChannel;
import com.google.cloud.WriteChannel;
import com.google.cloud.storage.Blob;
import com.google.cloud.storage.BlobId;
import com.google.cloud.storage.BlobInfo;
import com.google.cloud.storage.Bucket;
import com.google.cloud.storage.Storage;
import com.google.cloud.storage.StorageException;
import com.google.cloud.storage.StorageOptions;
import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import java.io.ByteArrayOutputStream;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.function.Function;

public final class Scenario {
  interface Step {
    JsonObject run() throws Exception;
  }

  private final JsonObject spec;
  private final Storage storage;
  private final JsonObject steps = new JsonObject();
  private final String photos;
  private final String videos;

  Scenario(JsonObject spec, Storage storage) {
    this.spec = spec;
    this.storage = storage;
    this.photos = spec.getAsJsonObject("buckets").get("photos").getAsString();
    this.videos = spec.getAsJsonObject("buckets").get("videos").getAsString();
  }

  static JsonObject digest(byte[] data) throws Exception {
    byte[] sum = MessageDigest.getInstance("SHA-256").digest(data);
    StringBuilder hex = new StringBuilder();
    for (byte b : sum) {
      hex.append(String.format("%02x", b));
    }
    JsonObject out = new JsonObject();
    out.addProperty("len", data.length);
    out.addProperty("sha256", hex.toString());
    return out;
  }

  static JsonObject resource(BlobInfo b) {
    if (b == null) {
      return null;
    }
    JsonObject out = new JsonObject();
    out.addProperty("bucket", b.getBucket());
    out.addProperty("name", b.getName());
    out.addProperty("size", String.valueOf(b.getSize()));
    out.addProperty("generation", String.valueOf(b.getGeneration()));
    out.addProperty("contentType", b.getContentType());
    if (b.getSelfLink() != null) {
      out.addProperty("selfLink", b.getSelfLink());
    }
    if (b.getMediaLink() != null) {
      out.addProperty("mediaLink", b.getMediaLink());
    }
    if (b.getMetadata() != null) {
      out.add("metadata", new Gson().toJsonTree(new TreeMap<>(b.getMetadata())));
    }
    return out;
  }

  static JsonObject errorOf(Throwable e) {
    JsonObject out = new JsonObject();
    out.addProperty("type", e.getClass().getName());
    out.addProperty("message", String.valueOf(e.getMessage()));
    if (e instanceof StorageException) {
      out.addProperty("code", ((StorageException) e).getCode());
    }
    StringWriter trace = new StringWriter();
    e.printStackTrace(new PrintWriter(trace));
    out.addProperty("stack", trace.toString());
    return out;
  }

  void step(String name, Step fn) {
    record(steps, name, fn, Scenario::errorOf);
  }

  /// Runs one step and adds its outcome to `steps` under `name`: what it
  /// returned with "ok": true, or "ok": false and the error as `describe`
  /// reports it. A failing step is recorded and the scenario goes on.
  static void record(JsonObject steps, String name, Step fn, Function<Throwable, JsonObject> describe) {
    JsonObject out;
    try {
      out = fn.run();
      if (out == null) {
        out = new JsonObject();
      }
      out.addProperty("ok", true);
    } catch (Throwable e) {
      out = new JsonObject();
      out.addProperty("ok", false);
      out.add("error", describe.apply(e));
    }
    steps.add(name, out);
  }

  /// Prints a report as the Rust tests read it: pretty JSON, nulls kept.
  static void print(JsonObject report) {
    Gson gson = new GsonBuilder().setPrettyPrinting().serializeNulls().disableHtmlEscaping().create();
    System.out.println(gson.toJson(report));
  }

  String object(String key) {
    return spec.getAsJsonObject("objects").get(key).getAsString();
  }

  static JsonObject with(String key, JsonElement value) {
    JsonObject out = new JsonObject();
    out.add(key, value);
    return out;
  }

  /// The bytes of `id` from `start`, `length` of them (to the end when
  /// negative), read through a ReadChannel.
  static byte[] readRange(Storage storage, BlobId id, long start, long length) throws Exception {
    try (ReadChannel reader = storage.reader(id)) {
      reader.seek(start);
      if (length >= 0) {
        reader.limit(start + length);
      }
      ByteArrayOutputStream out = new ByteArrayOutputStream();
      ByteBuffer buf = ByteBuffer.allocate(64 * 1024);
      while (reader.read(buf) >= 0) {
        buf.flip();
        out.write(buf.array(), 0, buf.limit());
        buf.clear();
      }
      return out.toByteArray();
    }
  }

  JsonObject list(boolean delimited) {
    String prefix = spec.get("list_prefix").getAsString();
    List<Storage.BlobListOption> options = new ArrayList<>();
    options.add(Storage.BlobListOption.prefix(prefix));
    if (delimited) {
      options.add(Storage.BlobListOption.currentDirectory());
    }
    JsonArray items = new JsonArray();
    List<String> prefixes = new ArrayList<>();
    for (Blob b : storage.list(photos, options.toArray(new Storage.BlobListOption[0])).iterateAll()) {
      if (b.isDirectory()) {
        prefixes.add(b.getName());
      } else {
        items.add(resource(b));
      }
    }
    prefixes.sort(null);
    JsonObject out = with("items", items);
    if (delimited) {
      out.add("prefixes", new Gson().toJsonTree(prefixes));
    }
    return out;
  }

  Step copyStep(String src, String dst) {
    return () -> {
      BlobId target = BlobId.of(videos, dst);
      Storage.CopyRequest req = Storage.CopyRequest.of(BlobId.of(photos, src), target);
      Blob copied = storage.copy(req).getResult();
      JsonObject out = with("resource", resource(copied));
      out.add("content", digest(storage.readAllBytes(target)));
      return out;
    };
  }

  void run() throws Exception {
    Path smallFile = Path.of(spec.get("small_file").getAsString());
    Path largeFile = Path.of(spec.get("large_file").getAsString());
    int chunkSize = spec.get("chunk_size").getAsInt();

    step("get_bucket", () -> {
      Bucket b = storage.get(photos);
      JsonObject r = new JsonObject();
      r.addProperty("name", b.getName());
      r.addProperty("id", b.getGeneratedId());
      if (b.getSelfLink() != null) {
        r.addProperty("selfLink", b.getSelfLink());
      }
      return with("resource", r);
    });

    // A multipart upload (metadata and data in one request, gzipped by default).
    step("small_upload", () -> {
      BlobInfo info = BlobInfo.newBuilder(photos, object("small")).setContentType("text/plain").build();
      return with("resource", resource(storage.create(info, Files.readAllBytes(smallFile))));
    });

    // A resumable upload in chunks of chunk_size (one PUT per chunk). The
    // writer returns no resource: the object is read back once it is closed.
    step("large_upload", () -> {
      BlobInfo info =
          BlobInfo.newBuilder(photos, object("large")).setContentType("application/octet-stream").build();
      try (WriteChannel writer = storage.writer(info)) {
        writer.setChunkSize(chunkSize);
        writer.write(ByteBuffer.wrap(Files.readAllBytes(largeFile)));
      }
      return with("resource", resource(storage.get(info.getBlobId())));
    });

    step("tree_upload", () -> {
      JsonArray out = new JsonArray();
      for (JsonElement t : spec.getAsJsonArray("tree")) {
        JsonObject entry = t.getAsJsonObject();
        BlobInfo info =
            BlobInfo.newBuilder(photos, entry.get("name").getAsString()).setContentType("text/plain").build();
        byte[] content = entry.get("content").getAsString().getBytes(StandardCharsets.UTF_8);
        out.add(resource(storage.create(info, content)));
      }
      return with("resources", out);
    });

    step("download_full", () -> {
      JsonObject out = new JsonObject();
      out.add("large", digest(storage.readAllBytes(BlobId.of(photos, object("large")))));
      out.add("small", digest(storage.readAllBytes(BlobId.of(photos, object("small")))));
      return out;
    });

    step("download_range", () -> {
      JsonObject range = spec.getAsJsonObject("range");
      long start = range.get("start").getAsLong();
      long length = range.get("length").getAsLong();
      return with("range", digest(readRange(storage, BlobId.of(photos, object("large")), start, length)));
    });

    step("list_delimited", () -> list(true));
    step("list_prefix", () -> list(false));

    // The Java library copies with rewriteTo.
    step("copy", copyStep(object("small"), object("copy")));
    step("rewrite", copyStep(object("large"), object("rewrite")));

    step("compose", () -> {
      JsonObject compose = spec.getAsJsonObject("compose");
      String destination = compose.get("destination").getAsString();
      List<String> sources = new ArrayList<>();
      for (JsonElement s : compose.getAsJsonArray("sources")) {
        sources.add(s.getAsString());
      }
      BlobInfo target = BlobInfo.newBuilder(photos, destination).setContentType("text/plain").build();
      Blob composed =
          storage.compose(Storage.ComposeRequest.newBuilder().addSource(sources).setTarget(target).build());
      JsonObject out = with("resource", resource(composed));
      out.add("content", digest(storage.readAllBytes(BlobId.of(photos, destination))));
      return out;
    });

    // update() is a PATCH, which the library's transport sends as a POST
    // with X-HTTP-Method-Override: PATCH.
    step("metadata_patch", () -> {
      Map<String, String> metadata = new HashMap<>();
      for (Map.Entry<String, JsonElement> e : spec.getAsJsonObject("metadata").entrySet()) {
        metadata.put(e.getKey(), e.getValue().getAsString());
      }
      BlobId id = BlobId.of(photos, object("small"));
      Blob updated = storage.update(BlobInfo.newBuilder(id).setMetadata(metadata).build());
      JsonObject out = with("resource", resource(updated));
      out.add("reloaded", resource(storage.get(id)));
      return out;
    });

    step("delete", () -> {
      BlobId id = BlobId.of(photos, spec.getAsJsonObject("compose").get("destination").getAsString());
      if (!storage.delete(id)) {
        throw new IllegalStateException("delete answered false: the object was not found");
      }
      JsonObject out = new JsonObject();
      out.addProperty("exists_after", storage.get(id) != null);
      return out;
    });

    // get() answers null for a missing object; a read throws the 404.
    step("not_found", () -> {
      JsonObject out = new JsonObject();
      out.addProperty("get_is_null", storage.get(BlobId.of(photos, object("missing"))) == null);
      try {
        storage.readAllBytes(BlobId.of(photos, object("missing")));
        out.add("error", null);
      } catch (StorageException e) {
        out.add("error", errorOf(e));
      }
      return out;
    });
  }

  public static void main(String[] args) throws Exception {
    if (args.length != 1) {
      System.err.println("usage: Scenario SPEC.json");
      System.exit(2);
    }
    String endpoint = System.getenv("BUCKETMAP_TEST_ENDPOINT");
    if (endpoint == null || endpoint.isEmpty()) {
      System.err.println("BUCKETMAP_TEST_ENDPOINT (http://127.0.0.1:PORT) is required");
      System.exit(2);
    }
    JsonObject spec =
        JsonParser.parseString(Files.readString(Path.of(args[0]), StandardCharsets.UTF_8)).getAsJsonObject();
    Storage storage =
        StorageOptions.newBuilder()
            .setHost(endpoint)
            .setProjectId("bucketmap-test")
            .setCredentials(NoCredentials.getInstance())
            .build()
            .getService();
    Scenario s = new Scenario(spec, storage);
    s.run();
    JsonObject report = new JsonObject();
    report.addProperty("client", "java");
    report.addProperty("library", "com.google.cloud:google-cloud-storage " + storage.getOptions().getLibraryVersion());
    report.addProperty("endpoint", endpoint);
    report.add("steps", s.steps);
    print(report);
    storage.close();
  }
}
