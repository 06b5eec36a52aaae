// Verify a Settle webhook delivery: Go 1.19+, standard library only.
// Run: go run verify.go SECRET TIMESTAMP_HEADER SIGNATURE_HEADER BODY_FILE
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

const toleranceS = 300

var unixSeconds = regexp.MustCompile(`^[0-9]{1,12}$`)

// Verify checks the x-service-timestamp and x-service-signature headers against the
// raw body (the bytes as received, before any JSON parsing).
func Verify(secret, timestamp, signature string, body []byte) error {
	if secret == "" {
		return errors.New("empty secret: set the endpoint's whsec_... secret")
	}
	ts := strings.TrimSpace(timestamp)
	if !unixSeconds.MatchString(ts) {
		return errors.New("x-service-timestamp is not unix seconds")
	}
	sent, _ := strconv.ParseInt(ts, 10, 64)
	if skew := time.Now().Unix() - sent; skew > toleranceS || skew < -toleranceS {
		return errors.New("timestamp outside the 300 s tolerance")
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	expected := []byte(hex.EncodeToString(mac.Sum(nil)))
	matched := false
	for _, part := range strings.Split(signature, ",") { // v1=<new>,v1=<old> during a rotation
		part = strings.TrimSpace(part)
		if strings.HasPrefix(part, "v1=") && hmac.Equal(expected, []byte(part[3:])) {
			matched = true
		}
	}
	if !matched {
		return errors.New("no v1= signature matches")
	}
	return nil
}

func main() {
	body, err := os.ReadFile(os.Args[4])
	if err == nil {
		err = Verify(os.Args[1], os.Args[2], os.Args[3], body)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "refused:", err)
		os.Exit(1)
	}
	fmt.Println("verified")
}
