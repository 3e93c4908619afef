package lakescore;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.SparkEnv;
import org.apache.spark.deploy.SparkHadoopUtil;
import org.apache.spark.sql.api.java.UDF1;

/**
 * A path's file bytes, read through the Hadoop filesystem of its scheme (a path without one: fs.defaultFS's): null
 * for a null path, a missing file or a directory; any other error fails the task with its own message.
 */
public final class HadoopFileBytes implements UDF1<String, byte[]> {
    private static final long serialVersionUID = 1L;

    /** The JVM's Hadoop settings, built once from its SparkConf, so that spark.hadoop.* settings reach them. */
    private static final class Settings {
        static final Configuration CONF = SparkHadoopUtil.get().newConfiguration(SparkEnv.get().conf());
    }

    @Override
    public byte[] call(String path) throws IOException {
        if (path == null) {
            return null;
        }
        Path file = new Path(path);
        FileSystem fs = file.getFileSystem(Settings.CONF);
        try (InputStream in = fs.open(file)) {
            return in.readAllBytes();
        } catch (FileNotFoundException notOpened) {
            // Java's local file streams say "not found" for a file they may not read too: that one is no missing file.
            if (isFile(fs, file)) {
                throw notOpened;
            }
            return null;
        }
    }

    private static boolean isFile(FileSystem fs, Path file) throws IOException {
        try {
            return fs.getFileStatus(file).isFile();
        } catch (FileNotFoundException missing) {
            return false;
        }
    }
}
