package streams.platform.streaming;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;
import java.util.stream.Stream;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Checkpoint files written through the fence: those of the lease's current epoch land,
 * those of a driver that lost it (a stale epoch, a heartbeat older than half the ttl, a released
 * lease) are refused and leave nothing behind.
 */
class FencedCheckpointFileManagerTest {
  @TempDir
  Path tmp;

  private Path leaseDir() {
    return tmp.resolve("_control").resolve("lease");
  }

  private void records(Map<Long, Map<String, Object>> records) throws IOException {
    Files.createDirectories(leaseDir());
    for (Map.Entry<Long, Map<String, Object>> e : records.entrySet()) {
      Files.write(leaseDir().resolve(String.format("%08d.json", e.getKey())),
          LeaseCasesTest.JSON.writeValueAsBytes(e.getValue()));
    }
  }

  private static Map<String, Object> holder(long epoch, double heartbeatAge) {
    double now = System.currentTimeMillis() / 1000.0;
    return Map.of("host", "worker-a", "pid", 7, "started_at", now - 600, "heartbeat_at", now - heartbeatAge,
        "epoch", epoch, "ttl", 30.0, "stream", "sensors");
  }

  /** The settings of a session whose driver holds {@code epoch} of the lease (null: one that holds none). */
  private Configuration conf(Long epoch) {
    Configuration conf = new Configuration();
    if (epoch != null) {
      conf.set(FencedCheckpointFileManager.LEASE_DIR, leaseDir().toString());
      conf.set(FencedCheckpointFileManager.LEASE_EPOCH, " " + epoch + " ");
    }
    return conf;
  }

  /** The fence over a manager that writes files as Spark's own do. */
  private CheckpointFileManager manager(Long epoch) {
    return new FencedCheckpointFileManager(new AtomicLocalFiles(), conf(epoch));
  }

  private Path checkpoint() {
    return tmp.resolve("checkpoint");
  }

  private static org.apache.hadoop.fs.Path hadoop(Path p) {
    return new org.apache.hadoop.fs.Path(p.toUri());
  }

  /** As Spark's checkpoint logs write a file: its folder first (not fenced), then the file whole. */
  private static void write(CheckpointFileManager manager, Path file, String text) throws IOException {
    manager.mkdirs(hadoop(file.getParent()));
    CheckpointFileManager.CancellableFSDataOutputStream out = manager.createAtomic(hadoop(file), false);
    out.write(text.getBytes(StandardCharsets.UTF_8));
    out.close();
  }

  /** Every file under the checkpoint (the temporary ones of a refused write among them). */
  private List<String> files() throws IOException {
    try (Stream<Path> all = Files.walk(checkpoint())) {
      return all.filter(Files::isRegularFile).map(p -> checkpoint().relativize(p).toString()).sorted()
          .collect(Collectors.toList());
    }
  }

  @Test
  void the_files_of_the_current_epoch_are_written() throws IOException {
    records(Map.of(3L, holder(3, 1)));
    CheckpointFileManager manager = manager(3L);
    write(manager, checkpoint().resolve("offsets/0"), "v1");
    assertEquals("v1", Files.readString(checkpoint().resolve("offsets/0")));
    assertTrue(manager.exists(hadoop(checkpoint().resolve("offsets/0"))));
    assertEquals(1, manager.list(hadoop(checkpoint().resolve("offsets"))).length);
    manager.delete(hadoop(checkpoint().resolve("offsets/0")));
    assertFalse(Files.exists(checkpoint().resolve("offsets/0")));
  }

  @Test
  void a_writer_with_a_stale_epoch_is_refused_and_leaves_nothing_behind() throws IOException {
    records(Map.of(3L, holder(3, 1)));
    CheckpointFileManager stale = manager(3L);
    write(stale, checkpoint().resolve("commits/0"), "batch 0");
    records(Map.of(4L, holder(4, 0))); // another driver took the stream over

    IOException refused = assertThrows(IOException.class,
        () -> write(stale, checkpoint().resolve("commits/1"), "batch 1"));
    assertTrue(refused.getMessage().contains("epoch 4 of the lease took the stream over; refusing to write"),
        refused.getMessage());
    UncheckedIOException delete = assertThrows(UncheckedIOException.class,
        () -> stale.delete(hadoop(checkpoint().resolve("commits/0"))));
    assertTrue(delete.getMessage().contains("refusing to delete"), delete.getMessage());
    assertEquals(List.of("commits/0"), files()); // the refused file's temporary one is gone too

    write(manager(4L), checkpoint().resolve("commits/1"), "batch 1 again"); // the new holder writes on
    assertEquals("batch 1 again", Files.readString(checkpoint().resolve("commits/1")));
  }

  @Test
  void a_writer_whose_heartbeat_is_older_than_half_its_ttl_is_refused() throws IOException {
    records(Map.of(5L, holder(5, 16)));
    IOException refused = assertThrows(IOException.class,
        () -> write(manager(5L), checkpoint().resolve("offsets/0"), "v"));
    assertTrue(refused.getMessage().contains("more than half its ttl of 30s"), refused.getMessage());
    assertEquals(List.of(), files());
  }

  @Test
  void a_released_lease_fences_its_epoch() throws IOException {
    Map<String, Object> released = new java.util.HashMap<>(holder(5, 1));
    released.put("released_at", System.currentTimeMillis() / 1000.0);
    records(Map.of(5L, released));
    IOException refused = assertThrows(IOException.class,
        () -> write(manager(5L), checkpoint().resolve("offsets/0"), "v"));
    assertTrue(refused.getMessage().contains("epoch 5 of the lease was released"), refused.getMessage());
  }

  @Test
  void a_session_that_holds_no_lease_is_fenced_by_none() throws IOException {
    records(Map.of(4L, holder(4, 0)));
    write(manager(null), checkpoint().resolve("offsets/0"), "backfill");
    assertEquals("backfill", Files.readString(checkpoint().resolve("offsets/0")));
  }

  @Test
  void a_record_that_is_not_whole_is_not_judged_the_next_write_checks_again() throws IOException {
    Files.createDirectories(leaseDir());
    double now = System.currentTimeMillis() / 1000.0;
    Files.writeString(leaseDir().resolve("00000002.json"), "{\"host\": \"worker-a\", \"heartbeat_at\": ");
    assertNull(FencedCheckpointFileManager.lost(leaseDir(), 2, now));
    Files.writeString(leaseDir().resolve("00000002.json"), "{\"host\": \"worker-a\", \"heartbeat_at\": null}");
    assertNull(FencedCheckpointFileManager.lost(leaseDir(), 2, now));
  }

  @Test
  void the_record_is_read_as_json_whatever_its_layout() throws IOException {
    Files.createDirectories(leaseDir());
    double now = 1_700_000_000.0;
    // spaced, reordered, nested and exponent-written values: only heartbeat_at, ttl and released_at count
    Files.writeString(leaseDir().resolve("00000002.json"), "{\n  \"ttl\" : 1.2E1,\n  \"extra\": {\"heartbeat_at\": 0},"
        + "\n  \"heartbeat_at\" :\t1.69999999E9, \"released_at\": null\n}");
    assertTrue(FencedCheckpointFileManager.lost(leaseDir(), 2, now).contains("is 10.0s old, more than half its ttl of 12s"),
        FencedCheckpointFileManager.lost(leaseDir(), 2, now));
    assertNull(FencedCheckpointFileManager.lost(leaseDir(), 2, now - 5));
  }

  @Test
  void its_files_are_written_by_the_manager_spark_would_have_picked() throws ReflectiveOperationException {
    java.lang.reflect.Field inner = FencedCheckpointFileManager.class.getDeclaredField("inner");
    inner.setAccessible(true);
    CheckpointFileManager manager = new FencedCheckpointFileManager(hadoop(checkpoint()), conf(3L));
    assertEquals(FileContextBasedCheckpointFileManager.class, inner.get(manager).getClass());
    assertTrue(manager.isLocal());
  }

  @Test
  void a_lost_files_checksum_file_goes_before_that_file_is_written_again() throws IOException {
    records(Map.of(3L, holder(3, 1)));
    Path commits = checkpoint().resolve("commits");
    Files.createDirectories(commits);
    Files.writeString(commits.resolve(".1.crc"), "1's"); // commits/1 lost as `rm` loses it: its checksum file stays
    Files.writeString(commits.resolve("2"), "v1 batch 2");
    Files.writeString(commits.resolve(".2.crc"), "2's");

    write(manager(3L), commits.resolve("1"), "v1 batch 1 replayed");
    assertEquals("v1 batch 1 replayed", Files.readString(commits.resolve("1")));
    // the stale one is gone (Hadoop's local file system writes the new file's own); a file's that exists stays
    assertEquals(List.of("commits/.2.crc", "commits/1", "commits/2"), files());
  }
}
