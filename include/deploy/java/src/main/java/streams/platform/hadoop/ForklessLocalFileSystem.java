package streams.platform.hadoop;

import org.apache.hadoop.fs.LocalFileSystem;

/**
 * The {@code file:} file system ({@code fs.file.impl}): Hadoop's checksummed local file
 * system over {@link ForklessRawLocalFileSystem}.
 */
public class ForklessLocalFileSystem extends LocalFileSystem {
  public ForklessLocalFileSystem() {
    super(new ForklessRawLocalFileSystem());
  }
}
