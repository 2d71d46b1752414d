package corpus;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpHandler;
import com.sun.net.httpserver.HttpServer;
import io.opentelemetry.api.trace.Span;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

/**
 * The corpus's lost update, write skew and phantom as a plain Java service: the JDK's HTTP server, JDBC on the
 * PostgreSQL driver with {@code ?} placeholders, one connection and one explicit transaction (autocommit off, READ
 * COMMITTED, the database's default) per request. Traced by the OpenTelemetry Java agent on its defaults; the code
 * itself only reads the current span's trace id to answer it in {@code X-Trace-Id}.
 *
 * <p>Each handler is registered on a context of its own ({@code /deposits/acc-1}: the context path is what the
 * agent reports as {@code http.route}); the request body is {@code {"args": [...]}}, the round's arguments; a refusal
 * answers 409 with {@code {"error": ...}}. {@code race(...)} is the corpus's race point: a no-op unless the request
 * carries {@code X-Race-Id} and the service was started with {@code corpus.race.port}, when it asks the driver's race
 * server (a line over a plain socket, so it is no span) and waits for its answer.
 *
 * <p>Started as {@code java -javaagent:... corpus.CorpusService <jdbc url>}; prints {@code listening on <port>}.
 */
public final class CorpusService {
    static final String READ = "SELECT balance FROM corpus_accounts WHERE account_no = ?";
    static final String READ_LOCKED = "SELECT balance FROM corpus_accounts WHERE account_no = ? FOR UPDATE";
    static final String WRITE = "UPDATE corpus_accounts SET balance = ? WHERE account_no = ?";
    static final String ADD = "UPDATE corpus_accounts SET balance = balance + ? WHERE account_no = ?";
    static final String COUNT = "SELECT count(*) FROM corpus_doctors WHERE shift = ? AND on_call";
    static final String LOCK = "SELECT name FROM corpus_doctors WHERE shift = ? AND on_call FOR UPDATE";
    static final String OFF = "UPDATE corpus_doctors SET on_call = false WHERE name = ?";
    static final String FIND = "SELECT booking_id FROM corpus_bookings WHERE room = ? AND day = ?";
    static final String INSERT =
            "INSERT INTO corpus_bookings (room, day, guest) VALUES (?, ?, ?) RETURNING booking_id";
    static final String FIND_SAFE = "SELECT booking_id FROM corpus_bookings_safe WHERE room = ? AND day = ?";
    static final String INSERT_SAFE = "INSERT INTO corpus_bookings_safe (room, day, guest) VALUES (?, ?, ?)"
            + " ON CONFLICT (room, day) DO NOTHING RETURNING booking_id";
    static final String SERIALIZATION_FAILURE = "40001";

    private static String jdbcUrl;
    private static int racePort;

    /** A business refusal: the request answers 409. */
    static class Refused extends Exception {
        Refused(String message) {
            super(message);
        }
    }

    /** Going off call would leave the shift with nobody on call. */
    static final class LastOnCall extends Refused {
        LastOnCall(String message) {
            super(message);
        }
    }

    /** The room is already booked that day. */
    static final class RoomTaken extends Refused {
        RoomTaken(String message) {
            super(message);
        }
    }

    /** One request's view of the round: the key from its path and the arguments from its body. */
    record Request(String key, List<String> args, String raceId) {
        int integer(int i) {
            return Integer.parseInt(args.get(i));
        }
    }

    interface Handler {
        String handle(Connection conn, Request request) throws SQLException, Refused, IOException;
    }

    // -- lost update ---------------------------------------------------------------------------------------------
    static int balance(ResultSet rs, String accountNo) throws SQLException, Refused {
        if (!rs.next()) {
            throw new Refused("no account " + accountNo);
        }
        return rs.getInt(1);
    }

    /** Buggy: unlocked read, the new balance computed here, written back unconditionally. */
    static String deposit(Connection conn, Request request) throws SQLException, Refused, IOException {
        String accountNo = request.key();
        int amount = request.integer(1);
        int balance;
        try (PreparedStatement read = conn.prepareStatement(READ)) {
            read.setString(1, accountNo);
            balance = balance(read.executeQuery(), accountNo);
        }
        race(request, "race");
        try (PreparedStatement write = conn.prepareStatement(WRITE)) {
            write.setInt(1, balance + amount);
            write.setString(2, accountNo);
            write.executeUpdate();
        }
        race(request, "written");
        conn.commit();
        race(request, "committed");
        return "{\"account_no\": " + quote(accountNo) + ", \"balance\": " + (balance + amount) + "}";
    }

    /** Control: the read takes the row lock (FOR UPDATE), so a concurrent deposit waits and reads our result. */
    static String depositLocked(Connection conn, Request request) throws SQLException, Refused, IOException {
        String accountNo = request.key();
        int amount = request.integer(1);
        race(request, "race");
        int balance;
        try (PreparedStatement read = conn.prepareStatement(READ_LOCKED)) {
            read.setString(1, accountNo);
            balance = balance(read.executeQuery(), accountNo);
        }
        try (PreparedStatement write = conn.prepareStatement(WRITE)) {
            write.setInt(1, balance + amount);
            write.setString(2, accountNo);
            write.executeUpdate();
        }
        race(request, "written");
        conn.commit();
        race(request, "committed");
        return "{\"account_no\": " + quote(accountNo) + ", \"balance\": " + (balance + amount) + "}";
    }

    /** Control: the same unlocked read, but the write is relative (balance = balance + ?). */
    static String depositAtomic(Connection conn, Request request) throws SQLException, Refused, IOException {
        String accountNo = request.key();
        int amount = request.integer(1);
        try (PreparedStatement read = conn.prepareStatement(READ)) {
            read.setString(1, accountNo);
            balance(read.executeQuery(), accountNo);
        }
        race(request, "race");
        try (PreparedStatement add = conn.prepareStatement(ADD)) {
            add.setInt(1, amount);
            add.setString(2, accountNo);
            add.executeUpdate();
        }
        race(request, "written");
        conn.commit();
        race(request, "committed");
        return "{\"account_no\": " + quote(accountNo) + "}";
    }

    // -- write skew ----------------------------------------------------------------------------------------------
    static int offCall(Connection conn, Request request, int attempt) throws SQLException, Refused, IOException {
        String name = request.key();
        int shift = request.integer(1);
        int onCall;
        try (PreparedStatement count = conn.prepareStatement(COUNT)) {
            count.setInt(1, shift);
            ResultSet rs = count.executeQuery();
            onCall = rs.next() ? rs.getInt(1) : 0;
        }
        if (onCall < 2) {
            throw new LastOnCall(name + " is the last doctor on call in shift " + shift + " (attempt " + attempt + ")");
        }
        race(request, "race");
        try (PreparedStatement off = conn.prepareStatement(OFF)) {
            off.setString(1, name);
            off.executeUpdate();
        }
        race(request, "written");
        return onCall;
    }

    /** Buggy: the count is not protected against a concurrent change of another doctor's row. */
    static String goOffCall(Connection conn, Request request) throws SQLException, Refused, IOException {
        int onCall = offCall(conn, request, 1);
        conn.commit();
        race(request, "committed");
        return "{\"name\": " + quote(request.key()) + ", \"on_call_before\": " + onCall + "}";
    }

    /** Control: the doctors on call are read with FOR UPDATE; a concurrent request waits and re-checks. */
    static String goOffCallLocked(Connection conn, Request request) throws SQLException, Refused, IOException {
        String name = request.key();
        int shift = request.integer(1);
        race(request, "race");
        List<String> names = new ArrayList<>();
        try (PreparedStatement lock = conn.prepareStatement(LOCK)) {
            lock.setInt(1, shift);
            ResultSet rs = lock.executeQuery();
            while (rs.next()) {
                names.add(rs.getString(1));
            }
        }
        if (names.size() < 2 || !names.contains(name)) {
            throw new LastOnCall(name + " cannot go off call: on call in shift " + shift + ": " + names);
        }
        try (PreparedStatement off = conn.prepareStatement(OFF)) {
            off.setString(1, name);
            off.executeUpdate();
        }
        race(request, "written");
        conn.commit();
        race(request, "committed");
        return "{\"name\": " + quote(name) + ", \"on_call_before\": " + names.size() + "}";
    }

    /** Control: the buggy transaction at SERIALIZABLE, retried once after a serialization failure. */
    static String goOffCallSerializable(Connection conn, Request request)
            throws SQLException, Refused, IOException {
        conn.setTransactionIsolation(Connection.TRANSACTION_SERIALIZABLE);
        for (int attempt = 1; ; attempt++) {
            try {
                int onCall = offCall(conn, request, attempt);
                conn.commit();
                race(request, "committed");
                return "{\"name\": " + quote(request.key()) + ", \"on_call_before\": " + onCall
                        + ", \"attempts\": " + attempt + "}";
            } catch (SQLException failure) {
                conn.rollback();
                if (attempt == 2 || !SERIALIZATION_FAILURE.equals(failure.getSQLState())) {
                    throw failure;
                }
            }
        }
    }

    // -- phantom -------------------------------------------------------------------------------------------------
    /** Buggy: check-then-insert with nothing that makes the check and the insert atomic. */
    static String book(Connection conn, Request request) throws SQLException, Refused, IOException {
        int room = Integer.parseInt(request.key());
        String day = request.args().get(1);
        try (PreparedStatement find = conn.prepareStatement(FIND)) {
            find.setInt(1, room);
            find.setString(2, day);
            if (find.executeQuery().next()) {
                throw new RoomTaken("room " + room + " is booked on " + day);
            }
        }
        race(request, "race");
        int bookingId;
        try (PreparedStatement insert = conn.prepareStatement(INSERT)) {
            insert.setInt(1, room);
            insert.setString(2, day);
            insert.setString(3, request.args().get(2));
            ResultSet rs = insert.executeQuery();
            rs.next();
            bookingId = rs.getInt(1);
        }
        race(request, "written");
        conn.commit();
        race(request, "committed");
        return "{\"room\": " + room + ", \"booking_id\": " + bookingId + "}";
    }

    /** Control: the unique constraint decides; the loser's ON CONFLICT DO NOTHING returns no row. */
    static String bookSafe(Connection conn, Request request) throws SQLException, Refused, IOException {
        int room = Integer.parseInt(request.key());
        String day = request.args().get(1);
        try (PreparedStatement find = conn.prepareStatement(FIND_SAFE)) {
            find.setInt(1, room);
            find.setString(2, day);
            if (find.executeQuery().next()) {
                throw new RoomTaken("room " + room + " is booked on " + day);
            }
        }
        race(request, "race");
        int bookingId;
        try (PreparedStatement insert = conn.prepareStatement(INSERT_SAFE)) {
            insert.setInt(1, room);
            insert.setString(2, day);
            insert.setString(3, request.args().get(2));
            ResultSet rs = insert.executeQuery();
            if (!rs.next()) {
                throw new RoomTaken("room " + room + " was booked on " + day + " meanwhile");
            }
            bookingId = rs.getInt(1);
        }
        race(request, "written");
        conn.commit();
        race(request, "committed");
        return "{\"room\": " + room + ", \"booking_id\": " + bookingId + "}";
    }

    // -- the service ---------------------------------------------------------------------------------------------
    static final Map<String, Handler> ROUTES = Map.of(
            "/deposits/", CorpusService::deposit,
            "/locked-deposits/", CorpusService::depositLocked,
            "/atomic-deposits/", CorpusService::depositAtomic,
            "/off-call/", CorpusService::goOffCall,
            "/locked-off-call/", CorpusService::goOffCallLocked,
            "/serializable-off-call/", CorpusService::goOffCallSerializable,
            "/bookings/", CorpusService::book,
            "/safe-bookings/", CorpusService::bookSafe);

    /** The corpus's race point: see the class comment. */
    static void race(Request request, String point) throws IOException {
        if (request.raceId() == null || racePort == 0) {
            return;
        }
        try (Socket socket = new Socket(InetAddress.getLoopbackAddress(), racePort)) {
            Writer out = new OutputStreamWriter(socket.getOutputStream(), StandardCharsets.UTF_8);
            out.write(request.raceId() + " " + point + "\n");
            out.flush();
            BufferedReader in =
                    new BufferedReader(new InputStreamReader(socket.getInputStream(), StandardCharsets.UTF_8));
            if (!"ok".equals(in.readLine())) {
                throw new IOException("race server refused " + point + " of " + request.raceId());
            }
        }
    }

    static HttpHandler serve(String context, Handler handler) {
        return exchange -> {
            int status;
            String body;
            try {
                Request request = new Request(exchange.getRequestURI().getPath().substring(context.length()),
                        args(new String(exchange.getRequestBody().readAllBytes(), StandardCharsets.UTF_8)),
                        exchange.getRequestHeaders().getFirst("X-Race-Id"));
                try (Connection conn = DriverManager.getConnection(jdbcUrl)) {
                    conn.setAutoCommit(false);
                    try {
                        body = handler.handle(conn, request);
                        status = 200;
                    } catch (SQLException | Refused | RuntimeException failure) {
                        conn.rollback();
                        throw failure;
                    }
                }
            } catch (Refused refused) {
                status = 409;
                body = "{\"error\": " + quote(refused.getClass().getSimpleName() + ": " + refused.getMessage()) + "}";
            } catch (SQLException | IOException | RuntimeException failure) {
                status = 500;
                body = "{\"error\": " + quote(failure.getClass().getSimpleName() + ": " + failure.getMessage()) + "}";
            }
            answer(exchange, status, body);
        };
    }

    static void answer(HttpExchange exchange, int status, String body) throws IOException {
        byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
        exchange.getResponseHeaders().set("Content-Type", "application/json");
        exchange.getResponseHeaders().set("X-Trace-Id", Span.current().getSpanContext().getTraceId());
        exchange.sendResponseHeaders(status, bytes.length);
        try (OutputStream out = exchange.getResponseBody()) {
            out.write(bytes);
        }
    }

    /** The elements of the body's {@code "args"} array, each as its text (strings unquoted): all the rounds send. */
    static List<String> args(String json) {
        List<String> out = new ArrayList<>();
        int i = json.indexOf('[', json.indexOf("\"args\"")) + 1;
        while (i > 0 && i < json.length() && json.charAt(i) != ']') {
            char c = json.charAt(i);
            if (c == '"') {
                StringBuilder s = new StringBuilder();
                for (i++; json.charAt(i) != '"'; i++) {
                    s.append(json.charAt(i) == '\\' ? json.charAt(++i) : json.charAt(i));
                }
                out.add(s.toString());
                i++;
            } else if (c == ',' || Character.isWhitespace(c)) {
                i++;
            } else {
                int end = i;
                while (end < json.length() && ",] \n".indexOf(json.charAt(end)) < 0) {
                    end++;
                }
                out.add(json.substring(i, end));
                i = end;
            }
        }
        return out;
    }

    static String quote(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }

    public static void main(String[] argv) throws IOException {
        jdbcUrl = argv[0];
        racePort = Integer.getInteger("corpus.race.port", 0);
        HttpServer server = HttpServer.create(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), 0);
        for (Map.Entry<String, Handler> route : ROUTES.entrySet()) {
            server.createContext(route.getKey(), serve(route.getKey(), route.getValue()));
        }
        ExecutorService workers = Executors.newCachedThreadPool();
        server.setExecutor(workers);
        server.start();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            server.stop(0);
            workers.shutdown();
        }));
        System.out.println("listening on " + server.getAddress().getPort());
        System.out.flush();
    }
}
