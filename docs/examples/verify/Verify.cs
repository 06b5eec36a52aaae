// Verify a Settle webhook delivery: .NET (Core 2.1+, 5+) or Mono 6, base library only.
// Run: mcs Verify.cs && mono Verify.exe SECRET TIMESTAMP_HEADER SIGNATURE_HEADER BODY_FILE
using System;
using System.IO;
using System.Security.Cryptography;
using System.Text;
using System.Text.RegularExpressions;

public static class SettleWebhook
{
    const long ToleranceS = 300;

    // timestamp, signature: the x-service-timestamp and x-service-signature headers;
    // body: the raw bytes (in ASP.NET Core, read Request.Body before any model binding).
    public static bool Verify(string secret, string timestamp, string signature, byte[] body)
    {
        if (string.IsNullOrEmpty(secret))
            throw new ArgumentException("empty secret: set the endpoint's whsec_... secret");
        var ts = timestamp.Trim();
        if (!Regex.IsMatch(ts, @"\A[0-9]{1,12}\z")
            || Math.Abs(DateTimeOffset.UtcNow.ToUnixTimeSeconds() - long.Parse(ts)) > ToleranceS)
            return false;
        var prefix = Encoding.ASCII.GetBytes(ts + ".");
        var message = new byte[prefix.Length + body.Length];
        Buffer.BlockCopy(prefix, 0, message, 0, prefix.Length);
        Buffer.BlockCopy(body, 0, message, prefix.Length, body.Length);
        byte[] mac;
        using (var hmac = new HMACSHA256(Encoding.UTF8.GetBytes(secret)))
            mac = hmac.ComputeHash(message);
        var expected = Encoding.ASCII.GetBytes(BitConverter.ToString(mac).Replace("-", "").ToLowerInvariant());
        var matched = false;
        foreach (var part in signature.Split(',')) // v1=<new>,v1=<old> during a rotation
        {
            var value = part.Trim();
            if (value.StartsWith("v1=", StringComparison.Ordinal))
                matched |= CryptographicOperations.FixedTimeEquals(expected, Encoding.UTF8.GetBytes(value.Substring(3)));
        }
        return matched;
    }

    public static int Main(string[] args)
    {
        if (!Verify(args[0], args[1], args[2], File.ReadAllBytes(args[3])))
        {
            Console.Error.WriteLine("refused");
            return 1;
        }
        Console.WriteLine("verified");
        return 0;
    }
}
