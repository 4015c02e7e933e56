// The XML plist reader: it agrees with plistlib on every fixture (each fixture's XML parses to what its binary
// decodes to) and reports malformed input with a line number.
import SDKWire
import Testing

@Suite struct XMLPropertyListTests {
    @Test(arguments: fixtureNames)
    func xmlFixtureMatchesBinaryFixture(_ name: String) throws {
        let xml = Array(try fixture(name, "xml"))
        let binary = Array(try fixture(name, "bplist"))
        #expect(try XMLPropertyList.parse(xml) == BinaryPlistDecoder.decode(binary))
    }

    @Test func entitiesEmptyFormsAndComments() throws {
        let text = """
            <?xml version="1.0"?>
            <!-- a comment -->
            <plist version="1.0"><dict>
              <key>a&amp;b</key><string>&lt;x&gt; &#233; &#x1F600;</string>
              <key>empty</key><string/>
              <key>d</key><dict/>
              <key>n</key><integer>-12</integer>
              <key>r</key><real>2.5</real>
              <key>t</key><true/>
              <key>when</key><date>2001-01-01T00:01:00Z</date>
              <key>bytes</key><data>AAEC</data>
            </dict></plist>
            """
        let v = try XMLPropertyList.parse(text)
        #expect(v["a&b"] == "<x> é 😀")
        #expect(v["empty"] == "")
        #expect(v["d"] == [:])
        #expect(v["n"] == -12)
        #expect(v["r"] == 2.5)
        #expect(v["t"] == true)
        #expect(v["when"] == .date(PlistDate(secondsSinceReferenceDate: 60)))
        #expect(v["bytes"] == .data([0, 1, 2]))
    }

    @Test func errorsCarryLineNumbers() {
        func error(_ text: String) -> XMLPlistError? {
            do { _ = try XMLPropertyList.parse(text); return nil } catch { return error }
        }
        #expect(error("<plist>\n<dict>\n<key>a</key>\n<integer>x</integer></dict></plist>")?.line == 4)
        #expect(error("<plist><dict><key>a</key><string>1</string><key>a</key><string>2</string></dict></plist>")?
            .detail == "duplicate key 'a'")
        #expect(error("<plist><dict><string>v</string></dict></plist>")?.detail.contains("expected <key>") == true)
        #expect(error("<plist><array><foo/></array></plist>")?.detail == "unknown element <foo>")
        #expect(error("<plist><string>open") != nil)
        #expect(error("<plist><string>a</string></plist> trailing")?.detail == "unexpected content after the top-level value")
    }

    @Test func unwritableDatesAreErrorsNotTraps() {
        for seconds in [Double.nan, .infinity, -.infinity, 1e300, -1e300] {
            let value: PlistValue = ["items": [["when": .date(PlistDate(secondsSinceReferenceDate: seconds))]]]
            do {
                _ = try XMLPropertyList.render(value)
                Issue.record("rendered a date of \(seconds) s")
            } catch {
                #expect(error.path == "items[0].when")
            }
        }
        #expect((try? XMLPropertyList.render(.date(PlistDate(secondsSinceReferenceDate: 60)))) != nil)
    }
}
