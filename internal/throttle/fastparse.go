package throttle

import "time"

// Fast paths for the reset encodings providers send most, each a strict
// subset of the general parser it stands in front of (time.ParseDuration,
// time.Parse(time.RFC3339, ...)), giving the same result; anything else goes
// to the general parser. FuzzSimpleDuration and FuzzRFC3339UTC compare them.

// parseSimpleDuration parses a Go duration made of integer components with
// the units h, m, s and ms ("6ms", "15ms", "6m0s", "1h30m"), at most six
// digits each. ok=false means "not this form": the caller uses
// time.ParseDuration. With ok=true the result is what time.ParseDuration
// returns, except that once the sum exceeds MaxReset it returns that partial
// sum at once (time.ParseDuration would return a larger value or an error;
// the caller rejects both).
func parseSimpleDuration(s string) (time.Duration, bool) {
	if s == "" {
		return 0, false
	}
	var d time.Duration
	for i := 0; i < len(s); {
		j := i
		var v int64
		for j < len(s) && j-i < 6 && isDigit(s[j]) {
			v = v*10 + int64(s[j]-'0')
			j++
		}
		if j == i || j >= len(s) || isDigit(s[j]) {
			return 0, false // no digits, no unit, or more than six digits
		}
		var unit time.Duration
		switch s[j] {
		case 'h':
			unit, j = time.Hour, j+1
		case 's':
			unit, j = time.Second, j+1
		case 'm':
			if j+1 < len(s) && s[j+1] == 's' {
				unit, j = time.Millisecond, j+2
			} else {
				unit, j = time.Minute, j+1
			}
		default:
			return 0, false
		}
		if j < len(s) && !isDigit(s[j]) {
			return 0, false // a longer unit ("mss", "ms.") or a fraction
		}
		d += time.Duration(v) * unit // v < 1e6, d <= MaxReset: no overflow
		if d > MaxReset {
			return d, true
		}
		i = j
	}
	return d, true
}

// parseRFC3339UTC parses exactly "YYYY-MM-DDTHH:MM:SSZ" (20 bytes, UTC, no
// fraction), with the field ranges time.Parse(time.RFC3339, ...) enforces
// (day within the month, hour < 24, minute and second < 60). ok=false means
// "not this form": the caller uses time.Parse.
func parseRFC3339UTC(s string) (time.Time, bool) {
	year, month, day, clock, ok := rfc3339UTCFields(s)
	if !ok {
		return time.Time{}, false
	}
	return time.Date(year, time.Month(month), day, 0, 0, clock, 0, time.UTC), true
}

// rfc3339UTCUnix is parseRFC3339UTC(s).Unix(), without building a
// time.Time: the same form and checks, ok=false for anything else.
func rfc3339UTCUnix(s string) (int64, bool) {
	year, month, day, clock, ok := rfc3339UTCFields(s)
	if !ok {
		return 0, false
	}
	return daysFromCivil(year, month, day)*86400 + int64(clock), true
}

// rfc3339UTCFields reads the date and the time of day (in seconds) of
// "YYYY-MM-DDTHH:MM:SSZ", checking the field ranges (see parseRFC3339UTC).
func rfc3339UTCFields(s string) (year, month, day, clock int, ok bool) {
	if len(s) != 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[19] != 'Z' {
		return 0, 0, 0, 0, false
	}
	year, ok1 := digits2(s, 0)
	year2, ok2 := digits2(s, 2)
	month, ok3 := digits2(s, 5)
	day, ok4 := digits2(s, 8)
	hour, ok5 := digits2(s, 11)
	minute, ok6 := digits2(s, 14)
	sec, ok7 := digits2(s, 17)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7) {
		return 0, 0, 0, 0, false
	}
	year = year*100 + year2
	if month < 1 || month > 12 || day < 1 || day > daysInMonth(month, year) || hour > 23 || minute > 59 || sec > 59 {
		return 0, 0, 0, 0, false
	}
	return year, month, day, hour*3600 + minute*60 + sec, true
}

// daysFromCivil is the number of days from 1970-01-01 to the proleptic
// Gregorian date (year >= 0, month 1-12, day 1-31): Howard Hinnant's
// days_from_civil.
func daysFromCivil(year, month, day int) int64 {
	if month <= 2 {
		year--
	}
	era := year
	if era < 0 {
		era -= 399
	}
	era /= 400
	yoe := year - era*400 // [0, 399]
	mp := month + 9       // March = 0
	if month > 2 {
		mp = month - 3
	}
	doy := (153*mp+2)/5 + day - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return int64(era)*146097 + int64(doe) - 719468
}

// digits2 parses the two ASCII digits at s[i:i+2].
func digits2(s string, i int) (int, bool) {
	a, b := s[i]-'0', s[i+1]-'0'
	if a > 9 || b > 9 {
		return 0, false
	}
	return int(a)*10 + int(b), true
}

// daysInMonth is the number of days of month (1-12) in the proleptic
// Gregorian year.
func daysInMonth(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// imfFixdateUnix parses an HTTP IMF-fixdate ("Sun, 06 Nov 1994 08:49:37
// GMT", RFC 9110 section 5.6.7, the form a Date field is sent in) into Unix
// seconds, with the field ranges of parseRFC3339UTC; ok=false for anything
// else. The day name is not checked (as time.Parse does not).
func imfFixdateUnix(s string) (int64, bool) {
	if len(s) != 29 || s[3] != ',' || s[4] != ' ' || s[7] != ' ' || s[11] != ' ' || s[16] != ' ' ||
		s[19] != ':' || s[22] != ':' || s[25:] != " GMT" {
		return 0, false
	}
	var month int
	switch s[8:11] {
	case "Jan":
		month = 1
	case "Feb":
		month = 2
	case "Mar":
		month = 3
	case "Apr":
		month = 4
	case "May":
		month = 5
	case "Jun":
		month = 6
	case "Jul":
		month = 7
	case "Aug":
		month = 8
	case "Sep":
		month = 9
	case "Oct":
		month = 10
	case "Nov":
		month = 11
	case "Dec":
		month = 12
	default:
		return 0, false
	}
	day, ok1 := digits2(s, 5)
	year, ok2 := digits2(s, 12)
	year2, ok3 := digits2(s, 14)
	hour, ok4 := digits2(s, 17)
	minute, ok5 := digits2(s, 20)
	sec, ok6 := digits2(s, 23)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) {
		return 0, false
	}
	year = year*100 + year2
	if day < 1 || day > daysInMonth(month, year) || hour > 23 || minute > 59 || sec > 59 {
		return 0, false
	}
	return daysFromCivil(year, month, day)*86400 + int64(hour*3600+minute*60+sec), true
}
