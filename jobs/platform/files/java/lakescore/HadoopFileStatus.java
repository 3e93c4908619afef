package lakescore;

import java.io.FileNotFoundException;
import java.io.IOException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.SparkEnv;
import org.apache.spark.deploy.SparkHadoopUtil;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;

/**
 * A path's file status, without reading the file: a row (length in bytes, modification time in milliseconds since
 * the epoch) from the Hadoop filesystem of its scheme; null for a null path, a missing file or a directory; any other
 * error fails the task with its own message.
 */
public final class HadoopFileStatus implements UDF1<String, Row> {
    private static final long serialVersionUID = 1L;

    /** The JVM's Hadoop settings, built once from its SparkConf, so that spark.hadoop.* settings reach them. */
    private static final class Settings {
        static final Configuration CONF = SparkHadoopUtil.get().newConfiguration(SparkEnv.get().conf());
    }

    @Override
    public Row call(String path) throws IOException {
        if (path == null) {
            return null;
        }
        Path file = new Path(path);
        FileStatus status;
        try {
            status = file.getFileSystem(Settings.CONF).getFileStatus(file);
        } catch (FileNotFoundException missing) {
            return null;
        }
        return status.isFile() ? RowFactory.create(status.getLen(), status.getModificationTime()) : null;
    }
}
