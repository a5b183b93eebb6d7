// An application logging through Logback, for tests/integration/test_agent_jvm_logging.py.
//
// Usage: java -Dlogback.configurationFile=XML -cp JARS:. LogbackApp EVENTS REFERENCE
//
// Logs EVENTS events to the logger "app.Service": two in three are one line (INFO), one in
// three is an ERROR with an exception thrown a varying number of calls deep, with a cause (and
// "... N common frames omitted"), sometimes a suppressed one. The XML routes them to a
// RollingFileAppender (the file the agent tails) and to Reference below, which writes what
// the same layout made of each event into REFERENCE, framed by its length: what the logging
// library wrote, event by event, for the test to compare the records with.

import ch.qos.logback.classic.PatternLayout;
import ch.qos.logback.classic.spi.ILoggingEvent;
import ch.qos.logback.core.AppenderBase;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

public class LogbackApp {
    public static class Reference extends AppenderBase<ILoggingEvent> {
        private String pattern;
        private String file;
        private PatternLayout layout;
        private OutputStream out;

        public void setPattern(String pattern) { this.pattern = pattern; }
        public void setFile(String file) { this.file = file; }

        @Override
        public void start() {
            layout = new PatternLayout();
            layout.setContext(getContext());
            layout.setPattern(pattern);
            layout.start();
            try {
                out = new FileOutputStream(file);
            } catch (IOException e) {
                addError("cannot open " + file, e);
                return;
            }
            super.start();
        }

        @Override
        protected void append(ILoggingEvent event) {
            byte[] text = layout.doLayout(event).getBytes(StandardCharsets.UTF_8);
            try {
                out.write((text.length + "\n").getBytes(StandardCharsets.US_ASCII));
                out.write(text);
                out.flush();
            } catch (IOException e) {
                addError("cannot write " + file, e);
            }
        }
    }

    private static final Logger log = LoggerFactory.getLogger("app.Service");

    static void fail(int request, int depth) throws Exception {
        if (depth > 0) {
            fail(request, depth - 1);
            return;
        }
        try {
            throw new IOException("disk closed under request " + request);
        } catch (IOException cause) {
            IllegalStateException e = new IllegalStateException("request " + request, cause);
            if (request % 5 == 0) {
                e.addSuppressed(new IllegalArgumentException("while closing " + request));
            }
            throw e;
        }
    }

    public static void main(String[] args) throws Exception {
        int events = Integer.parseInt(args[0]);
        for (int i = 0; i < events; i++) {
            if (i % 3 != 0) {
                log.info("request {} served", i);
                continue;
            }
            try {
                fail(i, i % 60);
            } catch (Exception e) {
                log.error("request {} failed", i, e);
            }
        }
        ((ch.qos.logback.classic.LoggerContext) LoggerFactory.getILoggerFactory()).stop();
    }
}
