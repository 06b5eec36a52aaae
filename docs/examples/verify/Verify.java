// Verify a Settle webhook delivery: Java 17+, JDK only.
// Run: java Verify.java SECRET TIMESTAMP_HEADER SIGNATURE_HEADER BODY_FILE
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.util.HexFormat;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

public final class Verify {
    static final long TOLERANCE_S = 300;

    /** timestamp, signature: the x-service-timestamp and x-service-signature headers; body: the raw bytes. */
    public static boolean verify(String secret, String timestamp, String signature, byte[] body)
            throws Exception {
        if (secret == null || secret.isEmpty()) {
            throw new IllegalArgumentException("empty secret: set the endpoint's whsec_... secret");
        }
        String ts = timestamp.strip();
        if (!ts.matches("[0-9]{1,12}")
                || Math.abs(System.currentTimeMillis() / 1000 - Long.parseLong(ts)) > TOLERANCE_S) {
            return false;
        }
        Mac mac = Mac.getInstance("HmacSHA256");
        mac.init(new SecretKeySpec(secret.getBytes(StandardCharsets.UTF_8), "HmacSHA256"));
        mac.update((ts + ".").getBytes(StandardCharsets.US_ASCII));
        byte[] expected = HexFormat.of().formatHex(mac.doFinal(body)).getBytes(StandardCharsets.US_ASCII);
        boolean matched = false;
        for (String part : signature.split(",")) { // v1=<new>,v1=<old> during a rotation
            String value = part.strip();
            if (value.startsWith("v1=")) {
                matched |= MessageDigest.isEqual(expected, value.substring(3).getBytes(StandardCharsets.UTF_8));
            }
        }
        return matched;
    }

    public static void main(String[] args) throws Exception {
        if (!verify(args[0], args[1], args[2], Files.readAllBytes(Path.of(args[3])))) {
            System.err.println("refused");
            System.exit(1);
        }
        System.out.println("verified");
    }
}
