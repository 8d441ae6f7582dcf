// The Java client's gRPC scenario: Google's google-cloud-storage over its gRPC
// transport (StorageOptions.grpc(), google.storage.v2.Storage) against a
// plaintext HTTP/2 endpoint, the steps and report of the Go gRPC scenario
// (sidecar/tests/clients/go/grpc.go), so the same checks apply.
//
// Usage: java -cp CLASSES:LIB/* GrpcScenario SPEC.json
//        (BUCKETMAP_TEST_GRPC_ENDPOINT=http://127.0.0.1:PORT)
//
// SPEC.json: {"buckets": {"photos": ID}, "small_file": PATH, "large_file":
// PATH, "range": {"start": N, "length": N}, "list_prefix": P, "objects":
// {"small": NAME, "large": NAME, "missing": NAME}}. The small object is
// written in one call (storage.create), the large one through a
// WriteChannel (the library's resumable write); reads use ReadObject through
// ReadChannel, and bidi_read_range reads through a BlobReadSession
// (BidiReadObject). An http:// host makes the library speak plaintext.

import com.google.api.core.ApiFuture;
import com.google.cloud.NoCredentials;
import com.google.cloud.WriteChannel;
import com.google.cloud.storage.Blob;
import com.google.cloud.storage.BlobId;
import com.google.cloud.storage.BlobInfo;
import com.google.cloud.storage.BlobReadSession;
import com.google.cloud.storage.RangeSpec;
import com.google.cloud.storage.ReadProjectionConfigs;
import com.google.cloud.storage.Storage;
import com.google.cloud.storage.StorageException;
import com.google.cloud.storage.StorageOptions;
import com.google.gson.JsonArray;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

public final class GrpcScenario {
  private final JsonObject spec;
  private final Storage storage;
  private final JsonObject steps = new JsonObject();
  private final String photos;

  GrpcScenario(JsonObject spec, Storage storage) {
    this.spec = spec;
    this.storage = storage;
    this.photos = spec.getAsJsonObject("buckets").get("photos").getAsString();
  }

  String object(String key) {
    return spec.getAsJsonObject("objects").get(key).getAsString();
  }

  void step(String name, Scenario.Step fn) {
    Scenario.record(steps, name, fn, GrpcScenario::errorOf);
  }

  /// Scenario.errorOf plus the gRPC status code, and whether it says
  /// "object not found" as the Go report does.
  static JsonObject errorOf(Throwable e) {
    JsonObject out = Scenario.errorOf(e);
    if (e instanceof StorageException) {
      StorageException se = (StorageException) e;
      out.addProperty("object_not_exist", se.getCode() == 404);
      if (se.getReason() != null) {
        out.addProperty("grpc_code", se.getReason());
      }
    }
    return out;
  }

  JsonObject writeSmall() throws Exception {
    byte[] data = Files.readAllBytes(Path.of(spec.get("small_file").getAsString()));
    BlobInfo info = blobInfo(object("small"));
    Blob blob = storage.create(info, data);
    return Scenario.with("resource", Scenario.resource(blob));
  }

  JsonObject writeLarge() throws Exception {
    byte[] data = Files.readAllBytes(Path.of(spec.get("large_file").getAsString()));
    BlobInfo info = blobInfo(object("large"));
    try (WriteChannel writer = storage.writer(info)) {
      ByteBuffer buf = ByteBuffer.wrap(data);
      while (buf.hasRemaining()) {
        writer.write(buf);
      }
    }
    return Scenario.with("resource", Scenario.resource(storage.get(BlobId.of(photos, object("large")))));
  }

  BlobInfo blobInfo(String name) {
    return BlobInfo.newBuilder(photos, name)
        .setContentType("application/octet-stream")
        .setMetadata(Map.of("scenario", "grpc"))
        .build();
  }

  JsonObject read(String name, long start, long length) throws Exception {
    return Scenario.with("data", Scenario.digest(Scenario.readRange(storage, BlobId.of(photos, name), start, length)));
  }

  JsonObject bidiRead(String name, long start, long length) throws Exception {
    ApiFuture<BlobReadSession> opening = storage.blobReadSession(BlobId.of(photos, name));
    try (BlobReadSession session = opening.get(60, TimeUnit.SECONDS)) {
      byte[] data =
          session
              .readAs(ReadProjectionConfigs.asFutureBytes().withRangeSpec(RangeSpec.of(start, length)))
              .get(60, TimeUnit.SECONDS);
      return Scenario.with("data", Scenario.digest(data));
    }
  }

  JsonObject list() {
    List<String> names = new ArrayList<>();
    String prefix = spec.get("list_prefix").getAsString();
    for (Blob b : storage.list(photos, Storage.BlobListOption.prefix(prefix)).iterateAll()) {
      names.add(b.getName());
    }
    Collections.sort(names);
    JsonArray out = new JsonArray();
    names.forEach(out::add);
    return Scenario.with("names", out);
  }

  JsonObject attrs() {
    Blob b = storage.get(BlobId.of(photos, object("large")));
    JsonObject out = Scenario.with("resource", Scenario.resource(b));
    byte[] crc = java.util.Base64.getDecoder().decode(b.getCrc32c());
    out.addProperty("crc32c", Long.toString(ByteBuffer.wrap(crc).getInt() & 0xffffffffL));
    return out;
  }

  JsonObject delete() {
    BlobId id = BlobId.of(photos, object("small"));
    if (!storage.delete(id)) {
      throw new IllegalStateException("delete answered false: the object was not found");
    }
    JsonObject out = new JsonObject();
    out.addProperty("exists_after", storage.get(id) != null);
    return out;
  }

  /// get() answers null for a missing object (reported as the Go client's
  /// ErrObjectNotExist); a read throws the NOT_FOUND.
  JsonObject notFound() {
    BlobId id = BlobId.of(photos, object("missing"));
    JsonObject out = new JsonObject();
    JsonObject attrs = new JsonObject();
    attrs.addProperty("object_not_exist", storage.get(id) == null);
    out.add("error", attrs);
    try {
      storage.readAllBytes(id);
      out.add("read_error", null);
    } catch (StorageException e) {
      out.add("read_error", errorOf(e));
    }
    return out;
  }

  void run() {
    JsonObject range = spec.getAsJsonObject("range");
    long start = range.get("start").getAsLong();
    long length = range.get("length").getAsLong();
    step("write_small", this::writeSmall);
    step("write_large", this::writeLarge);
    step("read_full", () -> read(object("large"), 0, -1));
    step("read_small", () -> read(object("small"), 0, -1));
    step("read_range", () -> read(object("large"), start, length));
    step("bidi_read_range", () -> bidiRead(object("large"), start, length));
    step("list", this::list);
    step("attrs", this::attrs);
    step("delete", this::delete);
    step("not_found", this::notFound);
  }

  public static void main(String[] args) throws Exception {
    if (args.length != 1) {
      System.err.println("usage: GrpcScenario SPEC.json");
      System.exit(2);
    }
    String endpoint = System.getenv("BUCKETMAP_TEST_GRPC_ENDPOINT");
    if (endpoint == null || !endpoint.startsWith("http://")) {
      System.err.println("BUCKETMAP_TEST_GRPC_ENDPOINT (http://127.0.0.1:PORT) is required");
      System.exit(2);
    }
    JsonObject spec =
        JsonParser.parseString(Files.readString(Path.of(args[0]), StandardCharsets.UTF_8)).getAsJsonObject();
    Storage storage =
        StorageOptions.grpc()
            .setHost(endpoint)
            .setProjectId("bucketmap-test")
            .setCredentials(NoCredentials.getInstance())
            .setAttemptDirectPath(false)
            .setEnableGrpcClientMetrics(false)
            .build()
            .getService();
    GrpcScenario s = new GrpcScenario(spec, storage);
    s.run();
    JsonObject report = new JsonObject();
    report.addProperty("client", "java");
    report.addProperty("library", "com.google.cloud:google-cloud-storage " + storage.getOptions().getLibraryVersion());
    report.addProperty("api", "grpc");
    report.addProperty("endpoint", endpoint);
    report.add("steps", s.steps);
    Scenario.print(report);
    storage.close();
  }
}
