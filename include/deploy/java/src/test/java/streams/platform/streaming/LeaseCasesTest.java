package streams.platform.streaming;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.hadoop.conf.Configuration;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;
import org.junit.jupiter.api.io.TempDir;

/**
 * The fencing rule run on the lease's table of cases (tests/spark_jobs/runtime/lease_cases.json),
 * which the Python lease's tests run too: whether the driver of an epoch may still write.
 */
class LeaseCasesTest {
  static final ObjectMapper JSON = new ObjectMapper();

  @TempDir
  Path tmp;

  /** The table: the pom's surefire settings name it; from this module's folder otherwise. */
  static JsonNode table() throws IOException {
    String file = System.getProperty("streams.lease.cases", "../../../tests/spark_jobs/runtime/lease_cases.json");
    return JSON.readTree(Files.readAllBytes(Paths.get(file)));
  }

  /** A lease record as the Python lease writes it ({@code Holder}), its times {@code now} less the case's ages. */
  static Map<String, Object> record(long epoch, JsonNode spec, double now) {
    Map<String, Object> record = new LinkedHashMap<>();
    record.put("host", "worker-b");
    record.put("pid", 41);
    record.put("started_at", now - 3600);
    record.put("heartbeat_at", now - spec.get("heartbeat_age").asDouble());
    record.put("stream", "sensors");
    record.put("epoch", epoch);
    record.put("ttl", spec.get("ttl").asDouble());
    record.put("launcher_pid", 40);
    record.put("pid_start", null);
    record.put("released_at", spec.has("released_age") ? now - spec.get("released_age").asDouble() : null);
    record.put("driver_id", "");
    record.put("launcher_start", null);
    return record;
  }

  /** Lays the case's records out in {@code dir}, as the Python lease names them. */
  static void layOut(Path dir, JsonNode records, double now) throws IOException {
    Files.createDirectories(dir);
    for (Iterator<Map.Entry<String, JsonNode>> it = records.fields(); it.hasNext(); ) {
      Map.Entry<String, JsonNode> entry = it.next();
      long epoch = Long.parseLong(entry.getKey());
      Files.write(dir.resolve(String.format("%08d.json", epoch)),
          JSON.writeValueAsBytes(record(epoch, entry.getValue(), now)));
    }
  }

  @TestFactory
  Stream<DynamicTest> everyCaseOfTheTable() throws IOException {
    JsonNode cases = table().get("cases");
    assertTrue(cases.size() >= 10, "the table of cases is there");
    List<DynamicTest> tests = new ArrayList<>();
    int i = 0;
    for (JsonNode c : cases) {
      Path dir = tmp.resolve("lease-" + i++);
      tests.add(DynamicTest.dynamicTest(c.get("case").asText(), () -> {
        double now = System.currentTimeMillis() / 1000.0;
        layOut(dir, c.get("records"), now);
        boolean writes = c.get("writes").asBoolean();
        String lost;
        if (c.get("epoch").isNull()) { // a session that holds no lease: the manager as Spark makes it
          Configuration conf = new Configuration();
          lost = new FencedCheckpointFileManager(new org.apache.hadoop.fs.Path(dir.toUri()), conf).lost();
        } else {
          lost = FencedCheckpointFileManager.lost(dir, c.get("epoch").asLong(), now);
        }
        assertEquals(writes, lost == null,
            () -> c.get("case").asText() + ": " + (lost == null ? "it may write" : "refused, " + lost));
        if (!writes) {
          assertNotNull(lost);
        }
      }));
    }
    return tests.stream();
  }
}
