<?php
// Verify a Settle webhook delivery: PHP 8.0+, no extension beyond the defaults.
// Run: php verify.php SECRET TIMESTAMP_HEADER SIGNATURE_HEADER BODY_FILE

const SETTLE_TOLERANCE_S = 300;

// $timestamp, $signature: $_SERVER['HTTP_X_SERVICE_TIMESTAMP'], $_SERVER['HTTP_X_SERVICE_SIGNATURE'];
// $body: the raw bytes, file_get_contents('php://input').
function settle_verify(string $secret, string $timestamp, string $signature, string $body): bool
{
    if ($secret === '') {
        throw new InvalidArgumentException("empty secret: set the endpoint's whsec_... secret");
    }
    $ts = trim($timestamp);
    if (preg_match('/\A[0-9]{1,12}\z/', $ts) !== 1 || abs(time() - (int) $ts) > SETTLE_TOLERANCE_S) {
        return false;
    }
    $expected = hash_hmac('sha256', $ts . '.' . $body, $secret);
    $matched = false;
    foreach (explode(',', $signature) as $part) { // v1=<new>,v1=<old> during a rotation
        $part = trim($part);
        if (str_starts_with($part, 'v1=')) {
            $matched = hash_equals($expected, substr($part, 3)) || $matched;
        }
    }
    return $matched;
}

if (PHP_SAPI === 'cli' && realpath($argv[0]) === __FILE__) {
    [, $secret, $timestamp, $signature, $path] = $argv;
    if (!settle_verify($secret, $timestamp, $signature, file_get_contents($path))) {
        fwrite(STDERR, "refused\n");
        exit(1);
    }
    echo "verified\n";
}
