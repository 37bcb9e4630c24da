// An embedded Jetty 9.4 (Debian's libjetty9-java) for tests/it/real_upstreams.rs: it
// listens on 127.0.0.1:<port> (its one argument), writes one line to stdout for every
// request that reaches it, "REQUEST <method> <target>", before anything answers it
// (requests Jetty refuses on its own, such as `POST *`, included), and answers 200.
// The target is as the request line named it: the authority of a CONNECT, else the path
// and query.
//
// Compiled by the test (tests/it/support/jetty.rs) with javac against
// /usr/share/java's jars.

import java.io.IOException;
import javax.servlet.http.HttpServletRequest;
import javax.servlet.http.HttpServletResponse;
import org.eclipse.jetty.http.HttpURI;
import org.eclipse.jetty.server.HttpChannel;
import org.eclipse.jetty.server.Request;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.server.handler.AbstractHandler;

public final class JettyLog {
    private JettyLog() {}

    /** The request line's target: Jetty fills the authority in from `Host` otherwise. */
    static String target(Request request) {
        HttpURI uri = request.getHttpURI();
        if ("CONNECT".equals(request.getMethod())) {
            return uri.getAuthority();
        }
        return uri.getPathQuery();
    }

    static String line(Request request) {
        return request.getMethod() + " " + target(request);
    }

    /** One line, flushed before the request is answered: the test reads it from the pipe. */
    static synchronized void log(String line) {
        System.out.println("REQUEST " + line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        Server server = new Server();
        ServerConnector connector = new ServerConnector(server);
        connector.setHost("127.0.0.1");
        connector.setPort(Integer.parseInt(args[0]));
        // Called for every request Jetty parsed, before any handler or its own refusal.
        connector.addBean(new HttpChannel.Listener() {
            @Override
            public void onRequestBegin(Request request) {
                log(line(request));
            }
        });
        server.addConnector(connector);
        server.setHandler(new AbstractHandler() {
            @Override
            public void handle(String target, Request base, HttpServletRequest request,
                    HttpServletResponse response) throws IOException {
                response.setStatus(200);
                response.setContentType("text/plain");
                response.getWriter().print("jetty: " + line(base) + "\n");
                base.setHandled(true);
            }
        });
        server.start();
        server.join();
    }
}
