# Verify a Settle webhook delivery: Ruby 3.0+, standard library only.
# Run: ruby verify.rb SECRET TIMESTAMP_HEADER SIGNATURE_HEADER BODY_FILE
require "openssl"

TOLERANCE_S = 300

# timestamp, signature: the x-service-timestamp and x-service-signature headers
# (in Rack: env["HTTP_X_SERVICE_TIMESTAMP"]); body: the raw bytes (request.raw_post).
def settle_verify(secret, timestamp, signature, body)
  raise ArgumentError, "empty secret: set the endpoint's whsec_... secret" if secret.to_s.empty?
  ts = timestamp.to_s.strip
  return false unless ts.match?(/\A[0-9]{1,12}\z/)
  return false if (Time.now.to_i - ts.to_i).abs > TOLERANCE_S

  expected = OpenSSL::HMAC.hexdigest("SHA256", secret, "#{ts}.".b + body.b)
  # v1=<new>,v1=<old> during a rotation; compare each in constant time
  signature.to_s.split(",").map(&:strip).select { |part| part.start_with?("v1=") }
           .map { |part| OpenSSL.secure_compare(expected, part[3..]) }
           .reduce(false) { |matched, same| matched | same }
end

if $PROGRAM_NAME == __FILE__
  secret, timestamp, signature, path = ARGV
  if settle_verify(secret, timestamp, signature, File.binread(path))
    puts "verified"
  else
    warn "refused"
    exit 1
  end
end
