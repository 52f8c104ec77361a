package streams.platform.hadoop;

import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;

/**
 * The processes this JVM starts. The folder {@code streams.spy.bin} comes first on the test JVM's
 * PATH (the pom's surefire settings): it gets a stand-in for each command Hadoop's file systems
 * run, which notes its name and arguments in a log, then runs the real command.
 */
final class ProcessSpy {
  static final List<String> COMMANDS = List.of("bash", "sh", "chmod", "chown", "chgrp", "ls", "stat", "readlink",
      "ln", "setsid", "id", "groups", "df", "du", "mkdir", "mv", "cp", "rm", "touch");

  private final Path log;

  private ProcessSpy(Path log) {
    this.log = log;
  }

  static ProcessSpy install() throws IOException {
    String bin = System.getProperty("streams.spy.bin");
    String path = System.getenv("PATH");
    assertTrue(bin != null && path != null && path.startsWith(bin + File.pathSeparator),
        "run through Maven (mvn test): the pom puts the folder of stand-ins first on the tests' PATH");
    Path dir = Files.createDirectories(Paths.get(bin));
    Path log = dir.resolve("started.log");
    for (String command : COMMANDS) {
      Path real = null;
      for (String entry : path.substring(bin.length() + 1).split(File.pathSeparator)) {
        Path candidate = Paths.get(entry.isEmpty() ? "." : entry, command);
        if (Files.isExecutable(candidate) && !Files.isDirectory(candidate)) {
          real = candidate.toAbsolutePath();
          break;
        }
      }
      if (real == null) {
        continue;
      }
      Path standIn = dir.resolve(command);
      Files.writeString(standIn, "#!/bin/sh\nprintf '%s\\n' \"" + command + " $*\" >> '" + log + "'\nexec '" + real
          + "' \"$@\"\n", StandardCharsets.UTF_8);
      Files.setPosixFilePermissions(standIn, PosixFilePermissions.fromString("rwxr-xr-x"));
    }
    ProcessSpy spy = new ProcessSpy(log);
    spy.clear();
    return spy;
  }

  /** The commands started since the last {@link #clear()}, each with its arguments. */
  List<String> started() throws IOException {
    return Files.exists(log) ? Files.readAllLines(log) : new ArrayList<>();
  }

  void clear() throws IOException {
    Files.deleteIfExists(log);
  }
}
