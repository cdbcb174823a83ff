// Browses and queries Tidemark's PostgreSQL listener through pgjdbc's DatabaseMetaData, as
// DBeaver, Metabase and Superset's JVM side do, and prints what it got as one JSON document;
// crates/tidemark-server/tests/pg.rs checks it. Run with Java's source launcher:
//
//   java -cp '.peers/pgjdbc/libs/*' PgJdbc.java HOST PORT PASSWORD STREAM [WRITE_PASSWORD]
//
// With WRITE_PASSWORD it also inserts through a prepared statement (three rows of host
// "jdbc") and counts them back.
import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.OffsetDateTime;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

public class PgJdbc {
    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://" + args[0] + ":" + args[1] + "/tidemark";
        String stream = args[3];
        Map<String, Object> out = new LinkedHashMap<>();
        try (Connection conn = DriverManager.getConnection(url, "analyst", args[2])) {
            DatabaseMetaData md = conn.getMetaData();
            out.put("product", md.getDatabaseProductName() + " " + md.getDatabaseProductVersion());
            out.put("major", md.getDatabaseMajorVersion());
            out.put("schemas", column(md.getSchemas(), "TABLE_SCHEM"));
            out.put("catalogs", column(md.getCatalogs(), "TABLE_CAT"));
            out.put("tables", column(md.getTables(null, "public", "%", new String[] {"TABLE"}), "TABLE_NAME"));
            List<String> columns = new ArrayList<>();
            try (ResultSet rs = md.getColumns(null, "public", stream, "%")) {
                while (rs.next()) {
                    columns.add(rs.getString("COLUMN_NAME") + ":" + rs.getString("TYPE_NAME") + ":"
                            + rs.getInt("DATA_TYPE") + ":" + rs.getString("IS_NULLABLE"));
                }
            }
            out.put("columns", columns);
            out.put("primary_keys", column(md.getPrimaryKeys(null, "public", stream), "COLUMN_NAME"));
            out.put("indexes", column(md.getIndexInfo(null, "public", stream, false, true), "INDEX_NAME"));
            try (PreparedStatement query = conn.prepareStatement(
                    "SELECT count(*) FROM " + stream + " WHERE usage > ?")) {
                query.setDouble(1, 2.0);
                try (ResultSet rs = query.executeQuery()) {
                    rs.next();
                    out.put("count_usage_over_2", rs.getLong(1));
                }
            }
            if (args.length > 4) {
                write(url, args[4], stream, out);
                try (PreparedStatement query = conn.prepareStatement(
                        "SELECT count(*) FROM " + stream + " WHERE host = ?")) {
                    query.setString(1, "jdbc");
                    try (ResultSet rs = query.executeQuery()) {
                        rs.next();
                        out.put("count_jdbc", rs.getLong(1));
                    }
                }
            }
        } catch (SQLException e) {
            out.put("error", e.getSQLState() + ": " + e.getMessage());
        }
        System.out.println(json(out));
    }

    // A prepared INSERT, run once and then as a batch of two, as an application loading
    // rows through JDBC does; connected with the write token.
    static void write(String url, String password, String stream, Map<String, Object> out)
            throws SQLException {
        try (Connection writer = DriverManager.getConnection(url, "loader", password);
                PreparedStatement insert = writer.prepareStatement(
                        "INSERT INTO " + stream + " (tstart, host, usage) VALUES (?, ?, ?)")) {
            insert.setObject(1, OffsetDateTime.parse("2023-11-14T22:14:00Z"));
            insert.setString(2, "jdbc");
            insert.setDouble(3, 9.5);
            out.put("inserted", insert.executeUpdate());
            for (int second = 1; second <= 2; second++) {
                insert.setObject(1, OffsetDateTime.parse("2023-11-14T22:14:0" + second + "Z"));
                insert.setString(2, "jdbc");
                insert.setDouble(3, 10.0 + second);
                insert.addBatch();
            }
            int batched = 0;
            for (int count : insert.executeBatch()) {
                batched += count;
            }
            out.put("batched", batched);
        }
    }

    static List<String> column(ResultSet rs, String name) throws SQLException {
        List<String> values = new ArrayList<>();
        try (rs) {
            while (rs.next()) {
                values.add(rs.getString(name));
            }
        }
        return values;
    }

    static String json(Object value) {
        if (value == null) {
            return "null";
        }
        if (value instanceof Number) {
            return value.toString();
        }
        if (value instanceof Map<?, ?> map) {
            List<String> fields = new ArrayList<>();
            for (Map.Entry<?, ?> e : map.entrySet()) {
                fields.add(json(e.getKey().toString()) + ":" + json(e.getValue()));
            }
            return "{" + String.join(",", fields) + "}";
        }
        if (value instanceof List<?> list) {
            List<String> items = new ArrayList<>();
            for (Object item : list) {
                items.add(json(item));
            }
            return "[" + String.join(",", items) + "]";
        }
        StringBuilder s = new StringBuilder("\"");
        for (char c : value.toString().toCharArray()) {
            switch (c) {
                case '"' -> s.append("\\\"");
                case '\\' -> s.append("\\\\");
                case '\n' -> s.append("\\n");
                default -> {
                    if (c < 0x20) {
                        s.append(String.format("\\u%04x", (int) c));
                    } else {
                        s.append(c);
                    }
                }
            }
        }
        return s.append('"').toString();
    }
}
