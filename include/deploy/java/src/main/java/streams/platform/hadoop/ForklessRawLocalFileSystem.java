package streams.platform.hadoop;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.attribute.GroupPrincipal;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.UserPrincipal;
import java.util.EnumSet;
import java.util.Map;
import java.util.Set;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's raw local file system without a new process for each file.
 *
 * <p>Without Hadoop's native library (which the pyspark package does not carry), {@link
 * RawLocalFileSystem} runs {@code chmod} in a new process for every file and directory it
 * creates, {@code readlink} twice for every rename through a {@code FileContext}, and {@code ls}
 * for the permission, owner and group of a file's status: every checkpoint file, state store
 * file and data file of a micro-batch, dozens per batch. This class does the same through Java's
 * NIO, in the JVM. Everything else is Hadoop's own.
 */
public class ForklessRawLocalFileSystem extends RawLocalFileSystem {

  private static final PosixFilePermission[] BITS = {
    PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
    PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
  };

  /** The mode's nine permission bits as NIO permissions. */
  static Set<PosixFilePermission> posix(short mode) {
    Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
    for (int bit = 0; bit < BITS.length; bit++) {
      if ((mode & (1 << bit)) != 0) {
        set.add(BITS[bit]);
      }
    }
    return set;
  }

  /** As {@code chmod} would; a sticky bit (which NIO cannot set) still goes through Hadoop's way. */
  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    short mode = permission.toShort();
    if ((mode & ~0777) != 0) {
      super.setPermission(p, permission);
      return;
    }
    Files.setPosixFilePermissions(pathToFile(p).toPath(), posix(mode));
  }

  /**
   * A file or directory's status, as Hadoop gives it, with its permission (the sticky bit too),
   * owner and group read in the JVM. (Hadoop's reads them with {@code ls -ld} when they are first
   * asked for.) Where the JVM cannot read a file's mode, Hadoop's status serves.
   */
  @Override
  public FileStatus getFileStatus(Path f) throws IOException {
    FileStatus status = super.getFileStatus(f);
    Map<String, Object> unix;
    try {
      unix = Files.readAttributes(pathToFile(f).toPath(), "unix:mode,owner,group");
    } catch (NoSuchFileException e) {
      throw new FileNotFoundException("File " + f + " does not exist");
    } catch (UnsupportedOperationException | IllegalArgumentException e) {
      return status;
    }
    return new FileStatus(status.getLen(), status.isDirectory(), status.getReplication(), status.getBlockSize(),
        status.getModificationTime(), status.getAccessTime(),
        new FsPermission((short) ((Integer) unix.get("mode") & 01777)),
        ((UserPrincipal) unix.get("owner")).getName(), ((GroupPrincipal) unix.get("group")).getName(),
        status.getPath());
  }

  /**
   * A file or directory's status; a symbolic link's as Hadoop gives it. (Hadoop asks
   * {@code readlink} for every path here, before finding that a file is not a link.)
   */
  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    if (!Files.isSymbolicLink(pathToFile(f).toPath())) {
      return getFileStatus(f);
    }
    return super.getFileLinkStatus(f);
  }
}
