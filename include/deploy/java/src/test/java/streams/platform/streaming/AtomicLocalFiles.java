package streams.platform.streaming;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.UUID;
import java.util.stream.Stream;

import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.PathFilter;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;

/**
 * A checkpoint manager that writes as Spark's own do, on the local disk: each file to a
 * temporary one beside it, renamed into place when closed, removed when cancelled. (Spark's
 * own need a whole Spark on the class path to close a file: its SQL settings.)
 */
final class AtomicLocalFiles implements CheckpointFileManager {
  private static Path local(org.apache.hadoop.fs.Path path) {
    return Paths.get(path.toUri());
  }

  @Override
  public CancellableFSDataOutputStream createAtomic(org.apache.hadoop.fs.Path path, boolean overwriteIfPossible) {
    Path target = local(path);
    Path temporary = target.resolveSibling("." + target.getFileName() + "." + UUID.randomUUID() + ".tmp");
    OutputStream out;
    try {
      out = Files.newOutputStream(temporary);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return new CancellableFSDataOutputStream(out) {
      private boolean done;

      @Override
      public void cancel() {
        if (!done) {
          done = true;
          try {
            out.close();
            Files.deleteIfExists(temporary);
          } catch (IOException e) {
            throw new UncheckedIOException(e);
          }
        }
      }

      @Override
      public void close() throws IOException {
        if (done) {
          return;
        }
        done = true;
        super.close();
        if (!overwriteIfPossible && Files.exists(target)) {
          Files.delete(temporary);
          throw new FileAlreadyExistsException(target.toString());
        }
        Files.move(temporary, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
      }
    };
  }

  @Override
  public FSDataInputStream open(org.apache.hadoop.fs.Path path) {
    throw new UnsupportedOperationException();
  }

  @Override
  public FileStatus[] list(org.apache.hadoop.fs.Path path, PathFilter filter) {
    try (Stream<Path> files = Files.list(local(path))) {
      return files.map(p -> new FileStatus(0, Files.isDirectory(p), 1, 0, 0, new org.apache.hadoop.fs.Path(p.toUri())))
          .filter(s -> filter.accept(s.getPath())).toArray(FileStatus[]::new);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  @Override
  public void mkdirs(org.apache.hadoop.fs.Path path) {
    try {
      Files.createDirectories(local(path));
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  @Override
  public boolean exists(org.apache.hadoop.fs.Path path) {
    return Files.exists(local(path));
  }

  @Override
  public void delete(org.apache.hadoop.fs.Path path) {
    try {
      Files.deleteIfExists(local(path));
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  @Override
  public boolean isLocal() {
    return true;
  }

  @Override
  public org.apache.hadoop.fs.Path createCheckpointDirectory() {
    throw new UnsupportedOperationException();
  }
}
