package streams.platform.streaming;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Paths;

import com.fasterxml.jackson.annotation.JsonIgnoreProperties;
import com.fasterxml.jackson.annotation.JsonProperty;
import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFileSystem;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathFilter;
import org.apache.hadoop.fs.UnsupportedFileSystemException;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Spark's own checkpoint writes, fenced by the stream's lease (spark_jobs/runtime/lease.py).
 *
 * <p>The Python driver checks its lease before each commit of its own, and halts its JVM when
 * it finds the lease lost. A JVM that was paused with its driver (a worker cut off, then back)
 * resumes at the same moment as the driver, though, and may write a checkpoint file of a query
 * that needs no Python (its offsets, its commit, its state, a file sink's log) before the
 * driver has killed it. This manager closes that window: every file Spark writes or deletes in
 * a checkpoint is refused unless the driver's epoch of the lease is still its own, as the
 * Python side judges it: no later epoch exists, the epoch is not released, and its heartbeat is
 * younger than half its ttl. The lease's folder and epoch come from the session's settings
 * {@code spark.streams.lease.dir} and {@code spark.streams.lease.epoch}, which a driver sets
 * once it holds the lease; without them (a backfill, a test) nothing is fenced.
 *
 * <p>The files themselves are written by Spark's own managers, chosen as Spark chooses.
 */
public final class FencedCheckpointFileManager implements CheckpointFileManager {
  public static final String LEASE_DIR = "spark.streams.lease.dir";
  public static final String LEASE_EPOCH = "spark.streams.lease.epoch";
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final Logger LOG = LoggerFactory.getLogger(FencedCheckpointFileManager.class);

  private final CheckpointFileManager inner;
  private final Configuration conf;
  private final java.nio.file.Path leaseDir;
  private final long epoch;

  public FencedCheckpointFileManager(Path path, Configuration conf) {
    this(spark(path, conf), conf);
  }

  /** Fences {@code inner}'s writes by the lease that {@code conf} names. */
  FencedCheckpointFileManager(CheckpointFileManager inner, Configuration conf) {
    this.inner = inner;
    this.conf = conf;
    String dir = conf.get(LEASE_DIR);
    String epoch = conf.get(LEASE_EPOCH);
    this.leaseDir = dir == null || dir.isEmpty() || epoch == null ? null : Paths.get(dir);
    this.epoch = this.leaseDir == null ? 0 : Long.parseLong(epoch.trim());
  }

  /** The manager Spark would have picked without this class. */
  private static CheckpointFileManager spark(Path path, Configuration conf) {
    try {
      return new FileContextBasedCheckpointFileManager(path, conf);
    } catch (RuntimeException e) {
      throw e;
    } catch (Exception e) {
      if (e instanceof UnsupportedFileSystemException) {
        return new FileSystemBasedCheckpointFileManager(path, conf);
      }
      throw new IllegalStateException(e);
    }
  }

  private static java.nio.file.Path record(java.nio.file.Path dir, long epoch) {
    return dir.resolve(String.format("%08d.json", epoch));
  }

  /** What the fence reads of a lease's record (spark_jobs/runtime/lease.py's {@code Holder}). */
  @JsonIgnoreProperties(ignoreUnknown = true)
  record Lease(@JsonProperty("heartbeat_at") Double heartbeatAt, @JsonProperty("ttl") Double ttl,
               @JsonProperty("released_at") Double releasedAt) {}

  /** Why the lease is no longer this driver's, or null while it is. */
  String lost() throws IOException {
    return leaseDir == null ? null : lost(leaseDir, epoch, System.currentTimeMillis() / 1000.0);
  }

  /**
   * The fencing rule: why the driver of {@code epoch} may no longer write at {@code now} (seconds
   * since the epoch, as the records' times), given the lease's records in {@code leaseDir}; null
   * while it may. Its cases: tests/spark_jobs/runtime/lease_cases.json.
   */
  static String lost(java.nio.file.Path leaseDir, long epoch, double now) throws IOException {
    if (Files.exists(record(leaseDir, epoch + 1))) {
      return "epoch " + (epoch + 1) + " of the lease took the stream over";
    }
    Lease lease;
    try {
      lease = JSON.readValue(Files.readAllBytes(record(leaseDir, epoch)), Lease.class);
    } catch (NoSuchFileException e) {
      return "the record of epoch " + epoch + " of the lease is gone";
    } catch (JsonProcessingException e) {
      return null; // not a whole record (records are replaced whole): the next write checks again
    }
    if (lease == null) {
      return null;
    }
    if (lease.releasedAt() != null) {
      return "epoch " + epoch + " of the lease was released";
    }
    if (lease.heartbeatAt() == null || lease.ttl() == null) {
      return null; // a record being replaced: the next write checks again
    }
    double age = now - lease.heartbeatAt();
    if (age > lease.ttl() / 2) {
      return String.format("the lease's heartbeat (epoch %d) is %.1fs old, more than half its ttl of %.0fs",
          epoch, age, lease.ttl());
    }
    return null;
  }

  private void fence(String what, Path path) throws IOException {
    String problem = lost();
    if (problem != null) {
      throw new IOException("stream lease lost (" + leaseDir + "): " + problem + "; refusing to " + what + " "
          + path + " (this driver must halt without committing)");
    }
  }

  @Override
  public CancellableFSDataOutputStream createAtomic(Path path, boolean overwriteIfPossible) {
    return new Fenced(inner.createAtomic(path, overwriteIfPossible), path);
  }

  @Override
  public FSDataInputStream open(Path path) {
    return inner.open(path);
  }

  @Override
  public FileStatus[] list(Path path, PathFilter filter) {
    return inner.list(path, filter);
  }

  @Override
  public void mkdirs(Path path) {
    inner.mkdirs(path);
  }

  @Override
  public boolean exists(Path path) {
    return inner.exists(path);
  }

  @Override
  public void delete(Path path) {
    try {
      fence("delete", path);
    } catch (IOException e) {
      throw new java.io.UncheckedIOException(e);
    }
    inner.delete(path);
  }

  @Override
  public boolean isLocal() {
    return inner.isLocal();
  }

  @Override
  public Path createCheckpointDirectory() {
    return inner.createCheckpointDirectory();
  }

  @Override
  public void close() {
    inner.close();
  }

  /**
   * Hadoop's local file system keeps a checksum file {@code .<name>.crc} beside each file. A file
   * lost without it (deleted by hand, or by a tool that knows nothing of checksum files) leaves it
   * behind, and the rename that writes the file again (a lost commit's batch replayed, a file
   * sink's log entry or a state file written again) fails on it: the query would end with
   * "Multiple streaming queries are concurrently using" its log. Such a checksum file describes
   * nothing, so it goes before the rename; under the lease, nothing else writes here meanwhile.
   */
  private void dropLostFilesChecksum(Path path) throws IOException {
    if (!(path.getFileSystem(conf) instanceof ChecksumFileSystem checksummed)) {
      return; // no checksum files (HDFS, object stores)
    }
    Path checksum = checksummed.getChecksumFile(path);
    if (!checksummed.exists(path) && checksummed.getRawFileSystem().delete(checksum, false)) {
      LOG.warn("removed {}, the checksum file of a lost file, before writing that file again", checksum);
    }
  }

  /** A file in the making: it takes its place (Spark's rename) only if the lease is still ours. */
  private final class Fenced extends CancellableFSDataOutputStream {
    private final CancellableFSDataOutputStream out;
    private final Path path;
    private boolean done;

    Fenced(CancellableFSDataOutputStream out, Path path) {
      super(out);
      this.out = out;
      this.path = path;
    }

    @Override
    public synchronized void cancel() {
      if (!done) {
        done = true;
        out.cancel();
      }
    }

    @Override
    public synchronized void close() throws IOException {
      if (done) {
        return;
      }
      try {
        fence("write", path);
        dropLostFilesChecksum(path);
      } catch (IOException e) {
        cancel();
        throw e;
      }
      done = true;
      out.close();
    }
  }
}
