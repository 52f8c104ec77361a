package streams.platform.hadoop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFileAttributes;
import java.util.EnumSet;
import java.util.List;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.CreateFlag;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileContext;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Options;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * The platform's local file system sets and reads permissions as Hadoop's own does, without
 * starting a process (Hadoop's, without its native library, runs {@code chmod}, {@code ls} and
 * {@code readlink}); through a {@code FileSystem} and through a {@code FileContext} alike.
 */
class ForklessFileSystemTest {
  static final URI LOCAL = URI.create("file:///");
  static ProcessSpy spy;
  static Configuration conf;

  @TempDir
  Path tmp;

  ForklessRawLocalFileSystem raw;

  @BeforeAll
  static void spyOnProcesses() throws IOException {
    spy = ProcessSpy.install();
    conf = new Configuration();
    conf.set("fs.permissions.umask-mode", "022");
    conf.set("fs.file.impl", ForklessLocalFileSystem.class.getName());
    conf.set("fs.AbstractFileSystem.file.impl", ForklessLocalFs.class.getName());
    conf.setBoolean("fs.file.impl.disable.cache", true);
  }

  @BeforeEach
  void fileSystem() throws IOException {
    raw = new ForklessRawLocalFileSystem();
    raw.initialize(LOCAL, conf);
    spy.clear();
  }

  private static org.apache.hadoop.fs.Path hadoop(Path p) {
    return new org.apache.hadoop.fs.Path(p.toUri());
  }

  private static short mode(Path p) throws IOException {
    short mode = 0;
    for (java.nio.file.attribute.PosixFilePermission bit : Files.getPosixFilePermissions(p)) {
      mode |= (short) (1 << (8 - bit.ordinal()));
    }
    return mode;
  }

  private void noProcessStarted() throws IOException {
    assertEquals(List.of(), spy.started(), "processes started");
  }

  @ParameterizedTest
  @ValueSource(shorts = {0, 0400, 0600, 0640, 0644, 0700, 0750, 0755, 0777, 0123})
  void set_permission_sets_every_bit_and_the_status_shows_it_without_a_process(short mode) throws IOException {
    Path file = Files.writeString(tmp.resolve("file"), "x");
    Path dir = Files.createDirectory(tmp.resolve("dir"));
    for (Path p : List.of(file, dir)) {
      raw.setPermission(hadoop(p), new FsPermission(mode));
      assertEquals(mode, mode(p), p.toString());
      FileStatus status = raw.getFileStatus(hadoop(p));
      assertEquals(new FsPermission(mode), status.getPermission(), p.toString());
      assertEquals(Files.getOwner(p).getName(), status.getOwner());
      assertEquals(Files.readAttributes(p, PosixFileAttributes.class).group().getName(), status.getGroup());
      assertEquals(Files.isDirectory(p), status.isDirectory());
    }
    noProcessStarted();
  }

  @Test
  void the_status_is_hadoop_s_own_whose_permission_hadoop_reads_with_a_process() throws IOException {
    RawLocalFileSystem hadoops = new RawLocalFileSystem();
    hadoops.initialize(LOCAL, conf);
    Path file = Files.writeString(tmp.resolve("file"), "twelve bytes");
    for (Path p : List.of(file, tmp)) {
      hadoops.setPermission(hadoop(p), new FsPermission((short) 0750));
      FileStatus theirs = hadoops.getFileStatus(hadoop(p));
      assertEquals(new FsPermission((short) 0750), theirs.getPermission());
      spy.clear();
      FileStatus ours = raw.getFileStatus(hadoop(p));
      noProcessStarted();
      assertEquals(theirs.getPermission(), ours.getPermission());
      assertEquals(theirs.getOwner(), ours.getOwner());
      assertEquals(theirs.getGroup(), ours.getGroup());
      assertEquals(theirs.getPath(), ours.getPath());
      assertEquals(theirs.getLen(), ours.getLen());
      assertEquals(theirs.isDirectory(), ours.isDirectory());
      assertEquals(theirs.getModificationTime(), ours.getModificationTime());
      assertEquals(theirs.getBlockSize(), ours.getBlockSize());
      assertEquals(theirs.getReplication(), ours.getReplication());
    }
    spy.clear();
    hadoops.setPermission(hadoop(file), new FsPermission((short) 0600));
    hadoops.getFileStatus(hadoop(file)).getPermission();
    List<String> started = spy.started();
    assertTrue(started.stream().anyMatch(c -> c.startsWith("chmod ")), "the spy sees Hadoop's chmod: " + started);
    assertTrue(started.stream().anyMatch(c -> c.startsWith("ls ")), "the spy sees Hadoop's ls: " + started);
  }

  @Test
  void a_sticky_bit_which_nio_cannot_set_goes_through_hadoop_and_shows_in_the_status() throws IOException {
    Path dir = Files.createDirectory(tmp.resolve("shared"));
    raw.setPermission(hadoop(dir), new FsPermission((short) 01777));
    assertTrue(spy.started().stream().anyMatch(c -> c.startsWith("chmod ")), "Hadoop's chmod");
    spy.clear();
    FsPermission permission = raw.getFileStatus(hadoop(dir)).getPermission();
    assertTrue(permission.getStickyBit());
    assertEquals(new FsPermission((short) 01777), permission);
    noProcessStarted();
  }

  @Test
  void a_file_created_with_a_permission_gets_it_less_the_umask_and_so_does_its_new_folder() throws IOException {
    FileSystem fs = FileSystem.get(LOCAL, conf);
    assertEquals(ForklessLocalFileSystem.class, fs.getClass());
    spy.clear();
    Path file = tmp.resolve("new/a.txt");
    try (FSDataOutputStream out = fs.create(hadoop(file), new FsPermission((short) 0666), true, 4096, (short) 1,
        1 << 20, null)) {
      out.write("one".getBytes(StandardCharsets.UTF_8));
    }
    assertEquals("one", Files.readString(file));
    assertEquals(0644, mode(file));
    assertEquals(0755, mode(file.getParent()));
    assertTrue(Files.exists(tmp.resolve("new/.a.txt.crc")), "checksummed, as Hadoop's local file system");
    assertEquals(new FsPermission((short) 0644), fs.getFileStatus(hadoop(file)).getPermission());
    fs.setPermission(hadoop(file), new FsPermission((short) 0600));
    assertEquals(0600, mode(file));
    assertTrue(fs.mkdirs(hadoop(tmp.resolve("made/deep")), new FsPermission((short) 0750)));
    assertEquals(0750, mode(tmp.resolve("made/deep")));
    noProcessStarted();
  }

  @Test
  void a_file_context_writes_and_renames_as_checkpoint_logs_do_without_a_process() throws IOException {
    FileContext fc = FileContext.getFileContext(LOCAL, conf);
    assertEquals(ForklessLocalFs.class, fc.getDefaultFileSystem().getClass());
    spy.clear();
    for (int i = 0; i < 5; i++) {
      org.apache.hadoop.fs.Path temporary = hadoop(tmp.resolve("log/." + i + ".tmp"));
      try (FSDataOutputStream out = fc.create(temporary, EnumSet.of(CreateFlag.CREATE),
          Options.CreateOpts.createParent(), Options.CreateOpts.perms(new FsPermission((short) 0640)))) {
        out.write(("v" + i).getBytes(StandardCharsets.UTF_8));
      }
      fc.rename(temporary, hadoop(tmp.resolve("log/" + i)), Options.Rename.NONE);
    }
    assertEquals("v4", Files.readString(tmp.resolve("log/4")));
    assertEquals(0640, mode(tmp.resolve("log/4")));
    FileAlreadyExistsException exists = assertThrows(FileAlreadyExistsException.class,
        () -> fc.rename(hadoop(tmp.resolve("log/3")), hadoop(tmp.resolve("log/4")), Options.Rename.NONE));
    assertTrue(exists.getMessage().contains("already exists"), exists.getMessage());
    fc.rename(hadoop(tmp.resolve("log/3")), hadoop(tmp.resolve("log/4")), Options.Rename.OVERWRITE);
    assertEquals("v3", Files.readString(tmp.resolve("log/4")));
    assertFalse(Files.exists(tmp.resolve("log/3")));
    fc.setPermission(hadoop(tmp.resolve("log/4")), new FsPermission((short) 0600));
    assertEquals(new FsPermission((short) 0600), fc.getFileStatus(hadoop(tmp.resolve("log/4"))).getPermission());
    assertEquals(new FsPermission((short) 0600), fc.getFileLinkStatus(hadoop(tmp.resolve("log/4"))).getPermission());
    assertThrows(FileNotFoundException.class, () -> fc.getFileLinkStatus(hadoop(tmp.resolve("log/3"))));
    noProcessStarted();
  }

  @Test
  void a_symbolic_link_is_still_one_and_a_missing_file_is_missing() throws IOException {
    RawLocalFileSystem hadoops = new RawLocalFileSystem();
    hadoops.initialize(LOCAL, conf);
    Path target = Files.writeString(tmp.resolve("target"), "abc");
    Path link = Files.createSymbolicLink(tmp.resolve("link"), target);
    // Hadoop sees a link only at a path without its scheme (file:/... is read as a relative name)
    for (org.apache.hadoop.fs.Path p : List.of(hadoop(link), new org.apache.hadoop.fs.Path(link.toString()))) {
      assertEquals(hadoops.getFileLinkStatus(p).isSymlink(), raw.getFileLinkStatus(p).isSymlink(), p.toString());
      assertEquals(3, raw.getFileLinkStatus(p).getLen());
    }
    FileStatus status = raw.getFileLinkStatus(new org.apache.hadoop.fs.Path(link.toString()));
    assertTrue(status.isSymlink());
    assertEquals(hadoop(target), status.getSymlink());
    assertEquals(3, raw.getFileStatus(hadoop(link)).getLen()); // followed
    assertThrows(FileNotFoundException.class, () -> raw.getFileStatus(hadoop(tmp.resolve("missing"))));
    assertThrows(FileNotFoundException.class, () -> raw.getFileLinkStatus(hadoop(tmp.resolve("missing"))));
  }
}
